#include "run/tensor_exchange.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "report/json.h"
#include "run/release_contract.h"

namespace dmpcheck::run {

void write_exchange_phase(const std::string& dir, const std::string& phase, const std::vector<ExchangePiece>& pieces) {
  std::filesystem::create_directories(dir);
  contract::Phase manifest;
  manifest.phase = phase;
  std::string bytes;
  for (const auto& p : pieces) {
    // Integers stay exact (a managed-collision module's ids); everything else is float32.
    const bool exact = p.tensor.scalar_type() == at::kLong;
    const at::Tensor t = p.tensor.detach().to(exact ? at::kLong : at::kFloat).contiguous();
    manifest.tensors.push_back({p.name, p.sharding, p.replicated, p.full_sizes, p.row_offset, p.col_offset,
                                t.sizes().vec(), bytes.size(), exact ? "int64" : "float32"});
    bytes.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  }
  report::write_text_file_atomically(dir + "/" + phase + ".bin", bytes);
  report::write_text_file_atomically(dir + "/" + phase + ".json", nlohmann::json(manifest).dump());
}

namespace {

// The elements a manifest's shape holds, every size checked: none negative, the product without
// overflow and within what one tensor of the exchange may hold (2^31 elements, 8 GiB of float32).
uint64_t checked_numel(const std::vector<int64_t>& sizes, const std::string& manifest_path, const std::string& name,
                       const char* field) {
  constexpr uint64_t kMostElements = uint64_t{1} << 31;
  DMP_CHECK(sizes.size() <= 8, ErrorKind::kRankFailed, "{}: '{}' has {} dimensions in {}", manifest_path, name,
            sizes.size(), field);
  uint64_t numel = 1;
  for (const int64_t size : sizes) {
    DMP_CHECK(size >= 0 && (size == 0 || numel <= kMostElements / static_cast<uint64_t>(size)), ErrorKind::kRankFailed,
              "{}: '{}' has {} [{}]: a negative size or over 2^31 elements", manifest_path, name, field,
              fmt::join(sizes, ", "));
    numel *= static_cast<uint64_t>(size);
  }
  return numel;
}

}  // namespace

std::vector<ExchangePiece> read_exchange_phase(const std::string& dir, const std::string& phase) {
  const std::string manifest_path = dir + "/" + phase + ".json";
  const std::string data_path = dir + "/" + phase + ".bin";
  DMP_CHECK(std::filesystem::exists(manifest_path), ErrorKind::kRankFailed,
            "{} is missing: the rank did not finish phase '{}'", manifest_path, phase);
  const auto manifest = contract::read_document_file<contract::Phase>(manifest_path);
  std::ifstream data_in(data_path, std::ios::binary);
  DMP_CHECK(data_in.good(), ErrorKind::kRankFailed, "{} is missing", data_path);
  const std::string data(std::istreambuf_iterator<char>(data_in), {});
  std::vector<ExchangePiece> out;
  for (const auto& e : manifest.tensors) {
    DMP_CHECK(e.dtype == "float32" || e.dtype == "int64", ErrorKind::kRankFailed,
              "{}: '{}' has dtype '{}'; the exchange holds float32 or int64", manifest_path, e.name, e.dtype);
    const auto type = e.dtype == "int64" ? at::kLong : at::kFloat;
    const size_t width = e.dtype == "int64" ? sizeof(int64_t) : sizeof(float);
    const uint64_t numel = checked_numel(e.sizes, manifest_path, e.name, "sizes");
    checked_numel(e.full_sizes, manifest_path, e.name, "full_sizes");
    DMP_CHECK(e.row_offset >= 0 && e.col_offset >= 0, ErrorKind::kRankFailed, "{}: '{}' has a negative offset ({}, {})",
              manifest_path, e.name, e.row_offset, e.col_offset);
    // Compared without wrapping: offset and length each within the file, then their sum.
    DMP_CHECK(e.offset <= data.size() && numel <= (data.size() - e.offset) / width, ErrorKind::kRankFailed,
              "{}: '{}' ({} elements at byte {}) runs past the {} bytes of {}", manifest_path, e.name, numel, e.offset,
              data.size(), data_path);
    ExchangePiece p{
        e.name, e.sharding, e.replicated, e.full_sizes, e.row_offset, e.col_offset, at::empty(e.sizes, type)};
    std::memcpy(p.tensor.data_ptr(), data.data() + e.offset, numel * width);
    out.push_back(std::move(p));
  }
  return out;
}

std::map<std::string, at::Tensor> assemble_full(const std::vector<std::vector<ExchangePiece>>& per_rank) {
  std::map<std::string, at::Tensor> full;
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    for (const auto& p : per_rank[rank]) {
      if (p.replicated) {
        if (rank == 0) full[p.name] = p.tensor;
        continue;
      }
      auto it = full.find(p.name);
      if (it == full.end()) it = full.emplace(p.name, at::zeros(p.full_sizes, p.tensor.scalar_type())).first;
      at::Tensor& whole = it->second;
      DMP_CHECK(
          whole.sizes().vec() == p.full_sizes && p.tensor.dim() == whole.dim() && whole.dim() >= 1 && whole.dim() <= 2,
          ErrorKind::kRankFailed, "rank {}: piece of '{}' with shape [{}] does not fit [{}]", rank, p.name,
          fmt::join(p.tensor.sizes(), ", "), fmt::join(p.full_sizes, ", "));
      DMP_CHECK(p.row_offset + p.tensor.size(0) <= whole.size(0) &&
                    (whole.dim() == 1 || p.col_offset + p.tensor.size(1) <= whole.size(1)),
                ErrorKind::kRankFailed, "rank {}: piece of '{}' at ({}, {}) runs past [{}]", rank, p.name, p.row_offset,
                p.col_offset, fmt::join(p.full_sizes, ", "));
      at::Tensor target = whole.narrow(0, p.row_offset, p.tensor.size(0));
      if (whole.dim() == 2) target = target.narrow(1, p.col_offset, p.tensor.size(1));
      target.copy_(p.tensor);
    }
  }
  return full;
}

std::vector<ExchangePiece> whole_pieces(const std::map<std::string, at::Tensor>& tensors) {
  std::vector<ExchangePiece> out;
  for (const auto& [name, t] : tensors) out.push_back({name, "whole", true, t.sizes().vec(), 0, 0, t});
  return out;
}

}  // namespace dmpcheck::run
