#include "comm/nccl/nccl_communicator.h"

#include <unistd.h>

#include <cstdlib>
#include <thread>

#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/store.h"
#include "common/digest.h"
#include "common/error.h"

namespace dmpcheck::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_text(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e)); }

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown-host";
  return buffer;
}

int nccl_version_code() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

std::string version_text(int code) {
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z from 2.9 on.
  return fmt::format("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100);
}

ncclDataType_t nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default:
      throw_error(ErrorKind::kInvalidInput,
                  fmt::format("NCCL cannot reduce tensors of type {}", std::string(c10::toString(type))));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  DMP_INTERNAL_ASSERT(false, "unknown reduce op");
}

void from_hex(const std::string& text, void* data, size_t size) {
  DMP_CHECK(text.size() == 2 * size, ErrorKind::kCommunication,
            "the NCCL unique id in the store has {} hex digits, expected {}", text.size(), 2 * size);
  DMP_CHECK(text.find_first_not_of("0123456789abcdef") == std::string::npos, ErrorKind::kCommunication,
            "the NCCL unique id in the store is not hex");
  auto* bytes = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<unsigned char>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
}

std::string shape(const at::Tensor& t) {
  return fmt::format("{}[{}]", std::string(c10::toString(t.scalar_type())), fmt::join(t.sizes(), ","));
}

int64_t byte_size(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// A device allocation that grows on demand and is reused across collectives.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  char* reserve(int64_t bytes) {
    if (bytes > capacity_) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = nullptr;
      capacity_ = 0;
      const cudaError_t e = cudaMalloc(&ptr_, static_cast<size_t>(bytes));
      DMP_CHECK(e == cudaSuccess, ErrorKind::kCommunication, "cudaMalloc of {} bytes for NCCL staging failed: {}",
                bytes, cuda_text(e));
      capacity_ = bytes;
    }
    return static_cast<char*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  int64_t capacity_ = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Store& store, int rank, int world_size, const NcclOptions& options)
      : rank_(rank), world_size_(world_size), timeout_(options.timeout), host_(host_name()) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    DMP_CHECK(e == cudaSuccess && count > 0, ErrorKind::kCommunication, "rank {} on {}: no CUDA GPU for NCCL: {}", rank,
              host_, e == cudaSuccess ? std::string("none found") : cuda_text(e));
    // One GPU per local rank; wrapping round is only reached where NCCL allows two ranks per GPU.
    device_ = options.local_rank % count;
    try {
      initialise(store, rank, world_size);
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override { release(); }

 private:
  void initialise(Store& store, int rank, int world_size) {
    cuda("cudaSetDevice", cudaSetDevice(device_));
    cuda("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cuda("cudaEventCreate", cudaEventCreate(&start_));
    cuda("cudaEventCreate", cudaEventCreate(&stop_));

    ncclUniqueId id{};
    if (rank == 0) {
      nccl("ncclGetUniqueId", "", ncclGetUniqueId(&id));
      store.set("nccl/unique_id", to_hex(reinterpret_cast<const uint8_t*>(&id), sizeof(id)));
    } else {
      from_hex(store.get("nccl/unique_id"), &id, sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a hung or failed peer can be aborted instead of blocking us
    ++sequence_;
    const ncclResult_t init = ncclCommInitRankConfig(&comm_, world_size, id, rank, &config);
    if (init != ncclSuccess && init != ncclInProgress) nccl("ncclCommInitRankConfig", "", init);
    wait_until_issued("ncclCommInitRankConfig", fmt::format("{} ranks", world_size));
  }

  // Finalizes (or, failing that, aborts) the communicator and frees what the constructor made.
  void release() noexcept {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      // Finalize flushes outstanding work; a communicator that does not finish in time is aborted.
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      }
      if (state == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    start_ = stop_ = nullptr;
    stream_ = nullptr;
  }

 public:
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::optional<double> last_device_seconds() const override { return last_device_seconds_; }

  void broadcast(at::Tensor& tensor, int root) override {
    DMP_CHECK(root >= 0 && root < world_size_, ErrorKind::kInvalidInput, "broadcast from rank {} in a world of {}",
              root, world_size_);
    use_device();
    at::Tensor host = tensor.contiguous();
    const int64_t bytes = byte_size(host);
    char* buffer = send_.reserve(std::max<int64_t>(bytes, 1));
    if (rank_ == root) to_device(buffer, host);
    collective("broadcast", shape(tensor), [&] {
      return ncclBroadcast(buffer, buffer, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_);
    });
    to_host(host, buffer);
    if (!host.is_same(tensor)) tensor.copy_(host);
  }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    use_device();
    at::Tensor host = tensor.contiguous();
    const ncclDataType_t type = nccl_type(host.scalar_type());
    char* buffer = send_.reserve(std::max<int64_t>(byte_size(host), 1));
    to_device(buffer, host);
    collective("all_reduce", shape(tensor), [&] {
      return ncclAllReduce(buffer, buffer, static_cast<size_t>(host.numel()), type, nccl_op(op), comm_, stream_);
    });
    to_host(host, buffer);
    if (!host.is_same(tensor)) tensor.copy_(host);
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& input) override {
    use_device();
    at::Tensor host = input.contiguous();
    const int64_t bytes = byte_size(host);
    char* in = send_.reserve(std::max<int64_t>(bytes, 1));
    char* out = recv_.reserve(std::max<int64_t>(bytes * world_size_, 1));
    to_device(in, host);
    collective("all_gather", shape(input),
               [&] { return ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, comm_, stream_); });
    auto sizes = host.sizes().vec();
    sizes.insert(sizes.begin(), world_size_);
    at::Tensor gathered = at::empty(sizes, host.options());
    to_host(gathered, out);
    return gathered.unbind(0);
  }

  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& input_splits,
                        const std::vector<int64_t>& output_splits) override {
    DMP_INTERNAL_ASSERT(
        static_cast<int>(input_splits.size()) == world_size_ && static_cast<int>(output_splits.size()) == world_size_,
        "all_to_all needs one split per rank");
    DMP_CHECK(input.dim() >= 1, ErrorKind::kInvalidInput, "all_to_all needs a tensor with rows, got {}", shape(input));
    int64_t in_rows = 0;
    for (int64_t s : input_splits) {
      DMP_CHECK(s >= 0, ErrorKind::kInvalidInput, "all_to_all split {} is negative", s);
      in_rows += s;
    }
    for (int64_t s : output_splits) DMP_CHECK(s >= 0, ErrorKind::kInvalidInput, "all_to_all split {} is negative", s);
    DMP_CHECK(in_rows == input.size(0), ErrorKind::kInvalidInput,
              "all_to_all input splits [{}] do not add up to the {} rows of {}", fmt::join(input_splits, ","),
              input.size(0), shape(input));
    use_device();
    at::Tensor host = input.contiguous();
    const int64_t row_bytes = host.dim() == 0 || host.size(0) == 0 ? 0 : byte_size(host) / host.size(0);
    int64_t out_rows = 0;
    for (int64_t s : output_splits) out_rows += s;
    auto sizes = host.sizes().vec();
    sizes[0] = out_rows;
    at::Tensor output = at::empty(sizes, host.options());
    const int64_t out_row_bytes = out_rows == 0 ? row_bytes : byte_size(output) / out_rows;
    char* in = send_.reserve(std::max<int64_t>(byte_size(host), 1));
    char* out = recv_.reserve(std::max<int64_t>(byte_size(output), 1));
    to_device(in, host);
    const std::string shapes = fmt::format("{} -> {}, splits in [{}] out [{}]", shape(input), shape(output),
                                           fmt::join(input_splits, ","), fmt::join(output_splits, ","));
    collective("all_to_all", shapes, [&] {
      ncclResult_t result = ncclGroupStart();
      if (result != ncclSuccess) return result;
      int64_t send_offset = 0;
      int64_t recv_offset = 0;
      for (int peer = 0; peer < world_size_; ++peer) {
        const int64_t send_bytes = input_splits[peer] * row_bytes;
        const int64_t recv_bytes = output_splits[peer] * out_row_bytes;
        if (send_bytes > 0) {
          result = ncclSend(in + send_offset, static_cast<size_t>(send_bytes), ncclUint8, peer, comm_, stream_);
          if (result != ncclSuccess && result != ncclInProgress) break;
        }
        if (recv_bytes > 0) {
          result = ncclRecv(out + recv_offset, static_cast<size_t>(recv_bytes), ncclUint8, peer, comm_, stream_);
          if (result != ncclSuccess && result != ncclInProgress) break;
        }
        send_offset += send_bytes;
        recv_offset += recv_bytes;
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess && result != ncclInProgress ? result : end;
    });
    to_host(output, out);
    return output;
  }

  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op) override {
    DMP_CHECK(input.dim() >= 1 && input.size(0) % world_size_ == 0, ErrorKind::kInvalidInput,
              "reduce_scatter needs dim 0 divisible by the world size {}, got {}", world_size_, shape(input));
    use_device();
    at::Tensor host = input.contiguous();
    auto sizes = host.sizes().vec();
    sizes[0] /= world_size_;
    at::Tensor output = at::empty(sizes, host.options());
    const ncclDataType_t type = nccl_type(host.scalar_type());
    char* in = send_.reserve(std::max<int64_t>(byte_size(host), 1));
    char* out = recv_.reserve(std::max<int64_t>(byte_size(output), 1));
    to_device(in, host);
    collective("reduce_scatter", shape(input), [&] {
      return ncclReduceScatter(in, out, static_cast<size_t>(output.numel()), type, nccl_op(op), comm_, stream_);
    });
    to_host(output, out);
    return output;
  }

  void barrier() override {
    use_device();
    char* buffer = send_.reserve(sizeof(float));
    collective("barrier", "", [&] { return ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

 private:
  // The current GPU is per host thread: a communicator used from another thread than the one
  // that made it must select its GPU again before allocating or enqueuing.
  void use_device() { cuda("cudaSetDevice", cudaSetDevice(device_)); }

  void to_device(char* device, const at::Tensor& host) {
    if (host.numel() == 0) return;
    cuda("cudaMemcpyAsync (to the GPU)", cudaMemcpyAsync(device, host.data_ptr(), static_cast<size_t>(byte_size(host)),
                                                         cudaMemcpyHostToDevice, stream_));
  }

  // Called once the collective has completed: a copy into pageable memory blocks the host, and
  // must not do so behind a collective that may never finish.
  void to_host(at::Tensor& host, const char* device) {
    if (host.numel() == 0) return;
    cuda("cudaMemcpyAsync (to the host)", cudaMemcpyAsync(host.data_ptr(), device, static_cast<size_t>(byte_size(host)),
                                                          cudaMemcpyDeviceToHost, stream_));
    wait_stream("copy to the host", "");
  }

  // Enqueues one NCCL call between two events on our stream and waits for it (with the staging
  // copy before it).  Non-blocking communicators may answer ncclInProgress: the call is then
  // issued once ncclCommGetAsyncError says so.
  template <typename Enqueue>
  void collective(const char* operation, const std::string& shapes, Enqueue&& enqueue) {
    ++sequence_;
    DMP_CHECK(comm_ != nullptr, ErrorKind::kCommunication,
              "rank {} on {}: nccl {} #{} on a communicator that was aborted after an earlier error", rank_, host_,
              operation, sequence_);
    cuda("cudaEventRecord", cudaEventRecord(start_, stream_));
    const ncclResult_t result = enqueue();
    if (result == ncclInProgress) {
      wait_until_issued(operation, shapes);
    } else if (result != ncclSuccess) {
      nccl(operation, shapes, result);
    }
    cuda("cudaEventRecord", cudaEventRecord(stop_, stream_));
    wait_stream(operation, shapes);
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, start_, stop_) == cudaSuccess) last_device_seconds_ = ms / 1e3;
  }

  // Waits for everything on our stream, polling NCCL for asynchronous errors (a peer that died
  // never completes the kernel) against the deadline.
  void wait_stream(const char* operation, const std::string& shapes) {
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) {
        abort_communicator();
        throw_error(ErrorKind::kCommunication,
                    fmt::format("rank {} on {} (GPU {}): nccl {} #{} of {}: CUDA reported {}", rank_, host_, device_,
                                operation, sequence_, describe_shapes(shapes), cuda_text(e)));
      }
      check_async(operation, shapes);
      if (Clock::now() > deadline) timed_out(operation, shapes);
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  }

  void wait_until_issued(const char* operation, const std::string& shapes) {
    const auto deadline = Clock::now() + timeout_;
    while (check_async(operation, shapes) == ncclInProgress) {
      if (Clock::now() > deadline) timed_out(operation, shapes);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The communicator's state: ncclSuccess or ncclInProgress; any error is thrown.
  ncclResult_t check_async(const char* operation, const std::string& shapes) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) nccl(operation, shapes, query);
    if (state != ncclInProgress) nccl(operation, shapes, state);  // returns at once on ncclSuccess
    return state;
  }

  [[noreturn]] void timed_out(const char* operation, const std::string& shapes) {
    abort_communicator();
    throw_error(ErrorKind::kTimeout,
                fmt::format("rank {} on {} (GPU {}): nccl {} #{} of {} did not complete within {} ms; the communicator "
                            "was aborted (a peer may have died or be running another collective)",
                            rank_, host_, device_, operation, sequence_, describe_shapes(shapes), timeout_.count()));
  }

  void nccl(const char* operation, const std::string& shapes, ncclResult_t result) {
    if (result == ncclSuccess) return;
    const char* last_error = ncclGetLastError(comm_);
    const std::string last = last_error != nullptr ? last_error : "";
    abort_communicator();
    throw_error(ErrorKind::kCommunication,
                fmt::format("rank {} on {} (GPU {}): nccl {} #{} of {} failed: {}{}", rank_, host_, device_, operation,
                            sequence_, describe_shapes(shapes), ncclGetErrorString(result),
                            last.empty() ? std::string() : ": " + last));
  }

  void cuda(const char* call, cudaError_t e) {
    if (e == cudaSuccess) return;
    abort_communicator();
    throw_error(ErrorKind::kCommunication,
                fmt::format("rank {} on {} (GPU {}): {} failed: {}", rank_, host_, device_, call, cuda_text(e)));
  }

  void abort_communicator() {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  static std::string describe_shapes(const std::string& shapes) { return shapes.empty() ? "no tensors" : shapes; }

  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::string host_;
  int device_ = -1;
  uint64_t sequence_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  DeviceBuffer send_;
  DeviceBuffer recv_;
  std::optional<double> last_device_seconds_;
};

}  // namespace

std::optional<std::string> nccl_unavailable_reason(int local_world_size) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
    return std::string("no CUDA GPU on this host (cudaGetDeviceCount found none)");
  }
  if (e != cudaSuccess) {
    return fmt::format(
        "no usable CUDA GPU on this host{}: cudaGetDeviceCount failed with {}",
        e == cudaErrorInsufficientDriver ? " (no NVIDIA driver, or one older than this CUDA runtime)" : "",
        cuda_text(e));
  }
  if (local_world_size > count) {
    const int version = nccl_version_code();
    const char* multi = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    const bool shared_gpus_allowed =
        version >= 23000 && multi != nullptr && std::string(multi) == "1" && local_world_size <= 2 * count;
    if (!shared_gpus_allowed) {
      return fmt::format(
          "{} ranks on this host need {} GPUs and it has {}: NCCL {} refuses two ranks on one GPU (\"Duplicate GPU "
          "detected\"){}",
          local_world_size, local_world_size, count, version_text(version),
          version >= 23000 ? "; NCCL_MULTI_RANK_GPU_ENABLE=1 allows up to two per GPU"
                           : "; NCCL 2.30 and later allow it with NCCL_MULTI_RANK_GPU_ENABLE=1");
    }
  }
  return std::nullopt;
}

std::unique_ptr<Communicator> make_nccl_communicator(Store& store, int rank, int world_size,
                                                     const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(store, rank, world_size, options);
}

}  // namespace dmpcheck::comm
