#include "dmp/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "common/error.h"
#include "common/file_io.h"
#include "common/names.h"
#include "dmp/embedding_config.h"
#include "dmp/torch_file.h"

namespace dmpcheck::dmp {
namespace {

namespace fs = std::filesystem;
using GenericDict = c10::Dict<c10::IValue, c10::IValue>;

// torch.save's zip format with a plain pickle: dicts, lists, strings, ints and tensors only, with
// no type tags (torch::jit::pickle_save tags every dict and list with
// torch.jit._pickle.restore_type_tag and writes int lists through build_intlist, which
// torch.load's weights_only unpickler, the default since torch 2.6, refuses).  Lists must be
// generic (c10::AnyType elements), never c10::List<int64_t>.
std::string plain_pickle_save(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, size_t size) { pickle.insert(pickle.end(), bytes, bytes + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return out;
}

template <typename T>
c10::impl::GenericList generic_list(const std::vector<T>& values) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const T& v : values) list.push_back(v);
  return list;
}

// Lists of ints as either kind of list: generic (this format) or typed (files written before it).
std::vector<int64_t> ints_of(const c10::IValue& value, const std::string& path, const std::string& what) {
  DMP_CHECK(value.isList(), ErrorKind::kInvalidInput, "{}: '{}' is a {}, not a list of integers", path, what,
            std::string(value.tagKind()));
  std::vector<int64_t> out;
  for (const auto& v : value.toListRef()) {
    DMP_CHECK(v.isInt(), ErrorKind::kInvalidInput, "{}: '{}' holds a {}, not an integer", path, what,
              std::string(v.tagKind()));
    out.push_back(v.toInt());
  }
  return out;
}

// The dict a torch-serialised file holds at its top level.
std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DMP_CHECK(in.good(), ErrorKind::kInvalidInput, "cannot open the checkpoint {}", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `bytes` (the file `path`) as torch.save's dict.
GenericDict dict_of(const std::vector<char>& bytes, const std::string& path) {
  check_torch_zip(bytes, path);
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    // Python pickles a one-element list with APPEND (0x61), which libtorch's unpickler lacks.
    const std::string what = e.what();
    DMP_CHECK(what.find("Unknown opcode for unpickling at 0x61") == std::string::npos, ErrorKind::kInvalidInput,
              "{} holds a list of one element, which Python pickles with an opcode (APPEND) libtorch cannot read: "
              "save it as a tuple (\"keys\": (\"f0\",)) or a list of two or more",
              path);
    throw_error(ErrorKind::kInvalidInput, fmt::format("{} is not a torch-serialised file: {}", path, e.what()));
  }
  DMP_CHECK(value.isGenericDict(), ErrorKind::kInvalidInput, "{}: expected a dict at the top level", path);
  return value.toGenericDict();
}

GenericDict read_dict(const std::string& path) { return dict_of(file_bytes(path), path); }

// A file's tensor, no larger than the bytes it stores: torch.save keeps an expanded tensor (stride
// 0) as its one stored element and its sizes, so a few bytes can ask for gigabytes the moment the
// tensor is copied, made contiguous or converted.  Refused before anything is allocated.
at::Tensor stored_tensor(const c10::IValue& value, const std::string& path, const std::string& what) {
  DMP_CHECK(value.isTensor(), ErrorKind::kInvalidInput, "{}: '{}' is not a tensor (it is a {})", path, what,
            std::string(value.tagKind()));
  const at::Tensor& t = value.toTensor();
  const int64_t stored =
      t.element_size() > 0 && t.has_storage() ? static_cast<int64_t>(t.storage().nbytes() / t.element_size()) : 0;
  DMP_CHECK(t.numel() <= stored, ErrorKind::kInvalidInput,
            "{}: '{}' has {} elements (sizes {}, strides {}) over {} stored: a tensor expanded beyond its data is "
            "refused (save it after .contiguous())",
            path, what, t.numel(), fmt::join(t.sizes(), "x"), fmt::join(t.strides(), ","), stored);
  return t;
}

c10::IValue field(const GenericDict& dict, const std::string& key, const std::string& path) {
  auto it = dict.find(key);
  DMP_CHECK(it != dict.end(), ErrorKind::kInvalidInput, "{}: the checkpoint has no '{}'", path, key);
  return it->value();
}

// A field of the kind the format says, or Error(kInvalidInput) naming the file, the field and the
// kind found (libtorch's own accessors fail as internal asserts naming neither).
int64_t int_field(const GenericDict& dict, const std::string& key, const std::string& path) {
  const c10::IValue v = field(dict, key, path);
  DMP_CHECK(v.isInt(), ErrorKind::kInvalidInput, "{}: '{}' is a {}, not an integer", path, key,
            std::string(v.tagKind()));
  return v.toInt();
}

std::string string_field(const GenericDict& dict, const std::string& key, const std::string& path) {
  const c10::IValue v = field(dict, key, path);
  DMP_CHECK(v.isString(), ErrorKind::kInvalidInput, "{}: '{}' is a {}, not a string", path, key,
            std::string(v.tagKind()));
  return v.toStringRef();
}

}  // namespace

void save_sharded_checkpoint(const std::string& directory, const DistributedModelParallel& model, int rank,
                             int world_size, int64_t steps) {
  GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("format", std::string("dmpcheck-sharded-v1"));
  top.insert("rank", static_cast<int64_t>(rank));
  top.insert("world_size", static_cast<int64_t>(world_size));
  top.insert("steps", steps);
  top.insert("plan", model.plan().serialize());
  c10::impl::GenericList pieces(c10::AnyType::get());
  for (const auto& s : model.state()) {
    GenericDict piece(c10::StringType::get(), c10::AnyType::get());
    piece.insert("name", s.name);
    piece.insert("sharding", s.sharding);
    piece.insert("row_offset", s.placement.row_offset);
    piece.insert("rows", s.placement.rows);
    piece.insert("col_offset", s.placement.col_offset);
    piece.insert("cols", s.placement.cols);
    piece.insert("full_sizes", generic_list(s.full_sizes));
    piece.insert("tensor", s.tensor.detach().clone());
    pieces.push_back(piece);
  }
  top.insert("pieces", pieces);
  write_file_atomically(fmt::format("{}/rank{}.pt", directory, rank), plain_pickle_save(top));
}

FullState load_sharded_checkpoint(const std::string& directory) {
  const std::string first = directory + "/rank0.pt";
  const GenericDict head = read_dict(first);
  const std::string format = string_field(head, "format", first);
  DMP_CHECK(format == "dmpcheck-sharded-v1", ErrorKind::kInvalidInput,
            "{}: not a dmpcheck sharded checkpoint (format '{}')", first, format);
  const int64_t world_size = int_field(head, "world_size", first);
  FullState state;
  state.steps = int_field(head, "steps", first);
  DMP_CHECK(state.steps >= 0, ErrorKind::kInvalidInput, "{}: 'steps' is {}, not a count of steps", first, state.steps);
  state.plan = string_field(head, "plan", first);
  DMP_CHECK(world_size >= 1 && world_size <= 4096, ErrorKind::kInvalidInput, "{}: world_size {} (expected 1 to 4096)",
            first, world_size);
  int64_t stored_bytes = 0;
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string path = fmt::format("{}/rank{}.pt", directory, r);
    if (fs::is_regular_file(path)) stored_bytes += static_cast<int64_t>(fs::file_size(path));
  }
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string path = fmt::format("{}/rank{}.pt", directory, r);
    DMP_CHECK(fs::exists(path), ErrorKind::kInvalidInput, "{}: missing; the checkpoint was saved by {} ranks", path,
              world_size);
    const GenericDict dict = r == 0 ? head : read_dict(path);
    const c10::IValue pieces = field(dict, "pieces", path);
    DMP_CHECK(pieces.isList(), ErrorKind::kInvalidInput, "{}: 'pieces' is a {}, not a list", path,
              std::string(pieces.tagKind()));
    for (const auto& item : pieces.toListRef()) {
      DMP_CHECK(item.isGenericDict(), ErrorKind::kInvalidInput, "{}: a piece is a {}, not a dict", path,
                std::string(item.tagKind()));
      const GenericDict piece = item.toGenericDict();
      const std::string name = string_field(piece, "name", path);
      const std::string sharding = string_field(piece, "sharding", path);
      const at::Tensor tensor = stored_tensor(field(piece, "tensor", path), path, name);
      const Shard placement{static_cast<int>(r),
                            int_field(piece, "row_offset", path),
                            int_field(piece, "rows", path),
                            int_field(piece, "col_offset", path),
                            int_field(piece, "cols", path),
                            0};
      auto it = state.tensors.find(name);
      if (it == state.tensors.end()) {
        const auto sizes = ints_of(field(piece, "full_sizes", path), path, name + "'s full_sizes");
        // Every element of a full tensor is stored in one of the ranks' files.
        int64_t elements = 1;
        for (const int64_t s : sizes) {
          DMP_CHECK(s >= 0 && (s == 0 || elements <= stored_bytes / s), ErrorKind::kInvalidInput,
                    "{}: '{}' claims full sizes {}, more than the {} bytes of the checkpoint's files hold", path, name,
                    fmt::join(sizes, "x"), stored_bytes);
          elements *= s;
        }
        it = state.tensors.emplace(name, at::zeros(sizes, tensor.scalar_type())).first;
      } else if (sharding == "dense" || sharding == "data_parallel") {
        continue;  // replicated: rank 0's copy is the one kept
      }
      // libtorch's narrow takes a negative offset from the end: such a piece would land unseen.
      for (const int64_t v : {placement.row_offset, placement.rows, placement.col_offset, placement.cols}) {
        DMP_CHECK(v >= 0 && v <= stored_bytes, ErrorKind::kInvalidInput,
                  "{}: the piece of '{}' is placed at rows {}+{}, columns {}+{}: each must be 0 to {}", path, name,
                  placement.row_offset, placement.rows, placement.col_offset, placement.cols, stored_bytes);
      }
      at::Tensor target;
      try {
        target = sharding == "dense" ? it->second : piece_of(it->second, placement, tensor.dim() != 2);
      } catch (const c10::Error&) {
        throw_error(ErrorKind::kInvalidInput,
                    fmt::format("{}: the piece of '{}' at rows {}+{}, columns {}+{} lies outside its full sizes {}",
                                path, name, placement.row_offset, placement.rows, placement.col_offset, placement.cols,
                                fmt::join(it->second.sizes(), "x")));
      }
      DMP_CHECK_EQ(tensor.sizes(), target.sizes(), ErrorKind::kInvalidInput,
                   "{}: piece of '{}' does not fit its place in the full tensor", path, name);
      target.copy_(tensor);
    }
  }
  return state;
}

void save_unsharded_checkpoint(const std::string& path, const FullState& state) {
  GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("format", std::string("dmpcheck-unsharded-v1"));
  top.insert("steps", state.steps);
  GenericDict tensors(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, t] : state.tensors) tensors.insert(name, t);
  top.insert("state_dict", tensors);
  write_file_atomically(path, plain_pickle_save(top));
}

FullState load_checkpoint(const std::string& path) {
  DMP_CHECK(fs::exists(path), ErrorKind::kInvalidInput, "checkpoint {} does not exist", path);
  if (fs::is_directory(path)) return load_sharded_checkpoint(path);
  return parse_checkpoint(file_bytes(path), path);
}

FullState parse_checkpoint(const std::vector<char>& bytes, const std::string& path) {
  const GenericDict top = dict_of(bytes, path);
  if (!top.contains("format")) {
    // A plain state_dict, as torch.save(model.state_dict()) writes it: weights under dmpcheck's
    // names (ebc.embedding_bags.<table>.weight, dense.<i>.weight / .bias), no step taken.
    FullState state;
    for (const auto& entry : top) {
      DMP_CHECK(entry.key().isString() && entry.value().isTensor(), ErrorKind::kInvalidInput,
                "{}: neither a dmpcheck checkpoint nor a state_dict of named tensors (an entry is a {} -> {})", path,
                std::string(entry.key().tagKind()), std::string(entry.value().tagKind()));
      state.tensors[entry.key().toStringRef()] =
          stored_tensor(entry.value(), path, entry.key().toStringRef()).to(at::kFloat).contiguous();
    }
    return state;
  }
  const c10::IValue format = field(top, "format", path);
  DMP_CHECK(format.isString() && format.toStringRef() == "dmpcheck-unsharded-v1", ErrorKind::kInvalidInput,
            "{}: not a dmpcheck unsharded checkpoint (format '{}')", path,
            format.isString() ? format.toStringRef() : std::string(format.tagKind()));
  FullState state;
  const c10::IValue steps = field(top, "steps", path);
  DMP_CHECK(steps.isInt() && steps.toInt() >= 0, ErrorKind::kInvalidInput, "{}: 'steps' is not a count of steps", path);
  state.steps = steps.toInt();
  const c10::IValue tensors = field(top, "state_dict", path);
  DMP_CHECK(tensors.isGenericDict(), ErrorKind::kInvalidInput, "{}: 'state_dict' is not a dict", path);
  for (const auto& entry : tensors.toGenericDict()) {
    DMP_CHECK(entry.key().isString(), ErrorKind::kInvalidInput, "{}: 'state_dict' has a key that is not a name", path);
    state.tensors[entry.key().toStringRef()] = stored_tensor(entry.value(), path, entry.key().toStringRef());
  }
  return state;
}

void save_batch(const std::string& path, const KeyedJaggedTensor& batch) {
  GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("keys", generic_list(batch.keys()));
  top.insert("values", batch.values());
  top.insert("lengths", batch.lengths());
  if (batch.weights()) top.insert("weights", *batch.weights());
  top.insert("stride", batch.stride());
  write_file_atomically(path, plain_pickle_save(top));
}

KeyedJaggedTensor load_batch(const std::string& path) {
  DMP_CHECK(fs::is_regular_file(path), ErrorKind::kInvalidInput, "batch file {} does not exist", path);
  return parse_batch(file_bytes(path), path);
}

KeyedJaggedTensor parse_batch(const std::vector<char>& bytes, const std::string& path) {
  const GenericDict top = dict_of(bytes, path);
  // An entry the reader does not know is refused, never ignored: a variable-batch KJT's
  // stride_per_key_per_rank or inverse_indices would otherwise replay as something else.
  for (const auto& entry : top) {
    const std::string key = entry.key().isString() ? entry.key().toStringRef() : std::string("<not a name>");
    DMP_CHECK(key == "keys" || key == "values" || key == "lengths" || key == "weights" || key == "stride",
              ErrorKind::kInvalidInput,
              "{}: unknown entry '{}'; a batch holds keys, values, lengths, stride and optionally weights (one "
              "batch size for every feature: a variable batch per feature or rank cannot be replayed yet)",
              path, key);
  }
  auto tensor_field = [&](const char* key) { return stored_tensor(field(top, key, path), path, key); };
  const c10::IValue key_list = field(top, "keys", path);
  DMP_CHECK(key_list.isList() || key_list.isTuple(), ErrorKind::kInvalidInput,
            "{}: 'keys' is not a list or tuple of feature names", path);
  // A list, or a tuple: how one feature's name is saved (see dict_of).
  const c10::ArrayRef<c10::IValue> names =
      key_list.isList() ? key_list.toListRef() : key_list.toTupleRef().elements().asArrayRef();
  std::vector<std::string> keys;
  for (const auto& k : names) {
    DMP_CHECK(k.isString(), ErrorKind::kInvalidInput, "{}: 'keys' holds a {}, not a feature name", path,
              std::string(k.tagKind()));
    keys.push_back(k.toStringRef());
  }
  at::Tensor values = tensor_field("values");
  at::Tensor lengths = tensor_field("lengths");
  DMP_CHECK(!values.is_floating_point() && !lengths.is_floating_point(), ErrorKind::kInvalidInput,
            "{}: 'values' and 'lengths' must be integer tensors (they are {} and {})", path,
            c10::toString(values.scalar_type()), c10::toString(lengths.scalar_type()));
  std::optional<at::Tensor> weights;
  if (top.contains("weights") && !top.at("weights").isNone()) weights = tensor_field("weights").to(at::kFloat);
  const c10::IValue stride = field(top, "stride", path);
  DMP_CHECK(stride.isInt(), ErrorKind::kInvalidInput, "{}: 'stride' (bags per feature) is not an integer", path);
  DMP_CHECK(stride.toInt() >= 0 && stride.toInt() <= lengths.numel(), ErrorKind::kInvalidInput,
            "{}: 'stride' {} (bags per feature) is not between 0 and the {} lengths the file holds", path,
            stride.toInt(), lengths.numel());
  DMP_CHECK(keys.empty() || lengths.numel() == stride.toInt() * static_cast<int64_t>(keys.size()),
            ErrorKind::kInvalidInput, "{}: {} lengths for {} keys of stride {} (expected {})", path, lengths.numel(),
            keys.size(), stride.toInt(), stride.toInt() * static_cast<int64_t>(keys.size()));
  try {
    return KeyedJaggedTensor(keys, values.to(at::kLong).contiguous(), lengths.to(at::kLong).contiguous(), weights);
  } catch (const Error& e) { throw_error(ErrorKind::kInvalidInput, fmt::format("{}: {}", path, e.what())); }
}

void check_state_fits(const DistributedModelParallel& model, const std::map<std::string, at::Tensor>& state,
                      const std::string& source) {
  const std::vector<StateTensor> held = model.state();
  std::map<std::string, const StateTensor*> by_name;
  for (const auto& s : held) by_name.emplace(s.name, &s);
  // The model's table a name belongs to ("" for none), and whether this rank holds any of it.
  auto table_of = [&](const std::string& name) {
    std::string found;
    for (const auto& t : model.plan().tables) {
      const std::string prefix = table_state_key(t.table, "");
      if (name.rfind(prefix, 0) == 0 && prefix.size() > found.size()) found = prefix;
    }
    return found;
  };
  auto held_here = [&](const std::string& prefix) {
    return std::any_of(held.begin(), held.end(), [&](const StateTensor& s) { return s.name.rfind(prefix, 0) == 0; });
  };
  for (const auto& [name, tensor] : state) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      // Not held here: a table's weight or optimizer state where the table is held elsewhere, or
      // optimizer state a fresh model has not made yet (a dense optimizer's, at its first step) or
      // another optimizer's.  Anything else names nothing of this model: a misspelt or extra tensor.
      static const std::set<std::string> kStateNames = {"exp_avg",         "exp_avg_sq", "momentum1", "momentum2",
                                                        "momentum_buffer", "sum",        "step"};
      auto is_state = [&](const std::string& word) { return kStateNames.count(word) > 0; };
      const std::string table = table_of(name);
      const std::string rest = table.empty() ? "" : name.substr(table.size());
      bool known = !table.empty() &&
                   (!held_here(table) || is_state(rest) || (rest.rfind("weight.", 0) == 0 && is_state(rest.substr(7))));
      for (const auto& h : held) {
        known = known ||
                (h.sharding == "dense" && name.rfind(h.name + ".", 0) == 0 && is_state(name.substr(h.name.size() + 1)));
      }
      if (known) continue;
      std::vector<std::string> names;
      for (const auto& h : held) names.push_back(h.name);
      throw_error(ErrorKind::kInvalidInput, fmt::format("{} holds '{}', which this model does not (it holds {})",
                                                        source, name, fmt::join(names, ", ")));
    }
    const StateTensor& s = *it->second;
    // A weight's shape is the model's; optimizer state may come in an older layout that loading
    // takes apart itself (row-wise state of a column-sharded table, [rows, shards]).
    const bool weight = ends_with(name, ".weight") || ends_with(name, ".bias");
    DMP_CHECK(!weight || tensor.sizes().vec() == s.full_sizes, ErrorKind::kInvalidInput,
              "{}: '{}' is [{}] but the model's is [{}]", source, name, fmt::join(tensor.sizes(), ", "),
              fmt::join(s.full_sizes, ", "));
    DMP_CHECK(at::is_floating_point(tensor), ErrorKind::kInvalidInput, "{}: '{}' holds {}, not floating point", source,
              name, std::string(c10::toString(tensor.scalar_type())));
    DMP_CHECK(at::isfinite(tensor).all().item<bool>(), ErrorKind::kInvalidInput, "{}: '{}' holds NaN or Inf", source,
              name);
  }
  for (const auto& s : held) {
    const bool weight = ends_with(s.name, ".weight") || ends_with(s.name, ".bias");
    DMP_CHECK(!weight || state.count(s.name) > 0, ErrorKind::kInvalidInput,
              "{} has no '{}', which the model holds ([{}])", source, s.name, fmt::join(s.full_sizes, ", "));
  }
}

}  // namespace dmpcheck::dmp
