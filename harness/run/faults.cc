#include "run/faults.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "comm/communicator.h"
#include "common/error.h"

namespace dmpcheck::run {

void inject_faults(const scenario::RunSpec& spec, comm::Communicator& comm, int step,
                   dmp::DistributedModelParallel& model, const std::function<void(const std::string&)>& say) {
  const int rank = comm.rank();
  for (const auto& f : spec.faults) {
    if (f.rank != rank || f.step != step) continue;
    say(fmt::format("injecting fault '{}' at step {}", scenario::fault_kind_name(f.kind), step));
    std::fflush(stdout);
    switch (f.kind) {
      case scenario::FaultKind::kCrash: std::raise(SIGSEGV); break;
      case scenario::FaultKind::kAbort: std::abort();
      case scenario::FaultKind::kKill: std::raise(SIGKILL); break;
      case scenario::FaultKind::kExit: std::_Exit(f.exit_code);
      case scenario::FaultKind::kThrow:
        throw_error(ErrorKind::kInjected, fmt::format("injected fault: rank {} throws at step {}", rank, step));
      case scenario::FaultKind::kHang:
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      case scenario::FaultKind::kDesync: {  // one collective the other ranks do not issue
        at::Tensor extra = at::zeros({3}, at::kFloat);
        comm.all_reduce(extra, comm::ReduceOp::kSum);
        break;
      }
      case scenario::FaultKind::kCorrupt:
      case scenario::FaultKind::kNan: {
        at::NoGradGuard no_grad;
        bool applied = false;
        for (const auto& t : model.state()) {
          if (!(f.tensor.empty() ? t.replicated : t.name == f.tensor) || t.tensor.numel() == 0) continue;
          applied = true;
          at::Tensor flat = t.tensor.view({-1});
          if (f.kind == scenario::FaultKind::kNan) {
            flat[0] = std::numeric_limits<float>::quiet_NaN();
          } else {  // one ulp up on the first element
            flat[0] = std::nextafter(flat[0].item<float>(), std::numeric_limits<float>::infinity());
          }
          break;
        }
        DMP_CHECK(applied, ErrorKind::kInvalidScenario, "fault '{}' on rank {}: this rank holds no tensor {}",
                  scenario::fault_kind_name(f.kind), rank,
                  f.tensor.empty() ? std::string("that is replicated") : "'" + f.tensor + "'");
        break;
      }
    }
  }
}

}  // namespace dmpcheck::run
