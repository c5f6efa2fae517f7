#include "run/tensor_exchange.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "report/json.h"

namespace dmpcheck::run {

void write_exchange_phase(const std::string& dir, const std::string& phase, const std::vector<ExchangePiece>& pieces) {
  std::filesystem::create_directories(dir);
  nlohmann::json entries = nlohmann::json::array();
  std::string bytes;
  for (const auto& p : pieces) {
    const at::Tensor t = p.tensor.detach().to(at::kFloat).contiguous();
    entries.push_back({{"name", p.name},
                       {"sharding", p.sharding},
                       {"replicated", p.replicated},
                       {"full_sizes", p.full_sizes},
                       {"row_offset", p.row_offset},
                       {"col_offset", p.col_offset},
                       {"sizes", t.sizes().vec()},
                       {"offset", bytes.size()}});
    bytes.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * sizeof(float));
  }
  report::write_text_file_atomically(dir + "/" + phase + ".bin", bytes);
  report::write_text_file_atomically(dir + "/" + phase + ".json",
                                     nlohmann::json{{"phase", phase}, {"tensors", entries}}.dump());
}

std::vector<ExchangePiece> read_exchange_phase(const std::string& dir, const std::string& phase) {
  const std::string manifest_path = dir + "/" + phase + ".json";
  const std::string data_path = dir + "/" + phase + ".bin";
  std::ifstream manifest_in(manifest_path);
  DMP_CHECK(manifest_in.good(), ErrorKind::kRankFailed, "{} is missing: the rank did not finish phase '{}'",
            manifest_path, phase);
  std::ifstream data_in(data_path, std::ios::binary);
  DMP_CHECK(data_in.good(), ErrorKind::kRankFailed, "{} is missing", data_path);
  const std::string data(std::istreambuf_iterator<char>(data_in), {});
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(manifest_in);
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kRankFailed, fmt::format("{}: not JSON: {}", manifest_path, e.what()));
  }
  std::vector<ExchangePiece> out;
  try {
    for (const auto& e : manifest.at("tensors")) {
      ExchangePiece p;
      p.name = e.at("name").get<std::string>();
      p.sharding = e.at("sharding").get<std::string>();
      p.replicated = e.at("replicated").get<bool>();
      p.full_sizes = e.at("full_sizes").get<std::vector<int64_t>>();
      p.row_offset = e.at("row_offset").get<int64_t>();
      p.col_offset = e.at("col_offset").get<int64_t>();
      const auto sizes = e.at("sizes").get<std::vector<int64_t>>();
      const auto offset = e.at("offset").get<size_t>();
      int64_t numel = 1;
      for (int64_t s : sizes) numel *= s;
      DMP_CHECK(offset + static_cast<size_t>(numel) * sizeof(float) <= data.size(), ErrorKind::kRankFailed,
                "{}: '{}' ends at byte {} but {} holds {}", manifest_path, p.name, offset + numel * sizeof(float),
                data_path, data.size());
      p.tensor = at::empty(sizes, at::kFloat);
      std::memcpy(p.tensor.data_ptr(), data.data() + offset, static_cast<size_t>(numel) * sizeof(float));
      out.push_back(std::move(p));
    }
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorKind::kRankFailed, fmt::format("{}: malformed manifest: {}", manifest_path, e.what()));
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
      if (it == full.end()) it = full.emplace(p.name, at::zeros(p.full_sizes, at::kFloat)).first;
      at::Tensor& whole = it->second;
      DMP_CHECK(whole.sizes().vec() == p.full_sizes && p.tensor.dim() == whole.dim() && whole.dim() <= 2,
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
