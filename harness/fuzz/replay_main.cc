// Runs a fuzz target without libFuzzer (any compiler).  Two modes:
//
//   TARGET DIR...                         replays every file under DIR (CTest, on every build)
//   TARGET --mutate SECONDS [--seed N] [--artifacts DIR] CORPUS...
//                                         mutates the corpus for SECONDS and runs each mutant
//   TARGET --runs N [--seed N] [--artifacts DIR] CORPUS...
//                                         runs N mutants, whatever time they take: the same seed
//                                         gives the same inputs on any machine (what `.ci/run` does,
//                                         seeded by the commit, so its verdict is the commit's)
//
// The mutating mode is the bounded fuzzing of ci/fuzz.sh --mutate and --runs: byte flips,
// interesting values, inserted, removed and repeated ranges, splices of two inputs.  Every input
// is written to <artifacts>/current before it runs, so a crash (a signal, an uncaught exception,
// an allocation past the address-space limit) leaves it behind; an input that runs longer than
// 10 s is a hang and is kept as <artifacts>/hang before the process aborts.  Without ASan it finds crashes,
// hangs and unbounded allocations, not silent memory errors (ci/fuzz.sh without --mutate, libFuzzer
// with ASan and UBSan, finds those).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

std::vector<Bytes> read_corpus(const std::vector<std::string>& dirs, size_t* files) {
  // In name order: a directory's own order differs between file systems, and the seed must draw the
  // same inputs on any machine.
  std::vector<std::filesystem::path> paths;
  for (const auto& dir : dirs) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (entry.is_regular_file()) paths.push_back(entry.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<Bytes> out;
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ++*files;
  }
  return out;
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// One to four edits of `input`, drawn from `rng`; `other` is another input to splice with.
Bytes mutate(Bytes input, const Bytes& other, std::mt19937_64& rng) {
  static const uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '[', '{', '"', '-', '9', 'e', '\n', ':'};
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 7) {
      case 0:
        if (!input.empty()) input[pick(input.size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (!input.empty()) input[pick(input.size())] = kInteresting[pick(sizeof(kInteresting))];
        break;
      case 2: {  // insert random bytes
        const size_t at = pick(input.size() + 1), n = 1 + pick(8);
        Bytes add(n);
        for (auto& b : add) b = static_cast<uint8_t>(rng());
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), add.begin(), add.end());
        break;
      }
      case 3: {  // remove a range
        if (input.empty()) break;
        const size_t at = pick(input.size()), n = 1 + pick(std::min<size_t>(input.size() - at, 64));
        input.erase(input.begin() + static_cast<std::ptrdiff_t>(at),
                    input.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 4: {  // repeat a range
        if (input.empty() || input.size() > (1u << 20)) break;
        const size_t at = pick(input.size()), n = 1 + pick(std::min<size_t>(input.size() - at, 64));
        const Bytes piece(input.begin() + static_cast<std::ptrdiff_t>(at),
                          input.begin() + static_cast<std::ptrdiff_t>(at + n));
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), piece.begin(), piece.end());
        break;
      }
      case 5: {  // a 4- or 8-byte little-endian integer set to an extreme
        if (input.size() < 8) break;
        const size_t at = pick(input.size() - 7);
        const uint64_t value = (rng() % 2) ? ~uint64_t{0} >> (rng() % 64) : uint64_t{1} << (rng() % 64);
        std::memcpy(input.data() + at, &value, (rng() % 2) ? 4 : 8);
        break;
      }
      default: {  // splice: this input's head, the other's tail
        const size_t head = pick(input.size() + 1), tail = pick(other.size() + 1);
        input.resize(head);
        input.insert(input.end(), other.begin() + static_cast<std::ptrdiff_t>(tail), other.end());
        break;
      }
    }
  }
  return input;
}

std::string g_hang_path;
Bytes* g_running = nullptr;

void on_alarm(int) {
  // A hang: keep the input under its own name (async-signal-safe calls only), then abort.
  const int fd = ::open(g_hang_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0 && g_running != nullptr) {
    (void)!::write(fd, g_running->data(), g_running->size());
    ::close(fd);
  }
  static const char kSaid[] = "fuzz: an input ran past 10 s (a hang): kept as 'hang' in the artifacts directory\n";
  (void)!::write(2, kSaid, sizeof(kSaid) - 1);
  std::abort();
}

int mutate_main(int argc, char** argv) {
  double seconds = 0;
  uint64_t runs_wanted = 0;
  uint64_t seed = 1;
  std::string artifacts = std::filesystem::temp_directory_path().string();
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutate" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--runs" && i + 1 < argc) {
      const std::string n = argv[++i];
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) {
        std::fprintf(stderr, "fuzz: --runs takes a count of mutants (digits), not '%s'\n", n.c_str());
        return 2;
      }
      runs_wanted = std::strtoull(n.c_str(), nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--artifacts" && i + 1 < argc) {
      artifacts = argv[++i];
    } else {
      dirs.push_back(a);
    }
  }
  size_t files = 0;
  const std::vector<Bytes> corpus = read_corpus(dirs, &files);
  if (corpus.empty() || (seconds <= 0) == (runs_wanted == 0)) {
    std::fprintf(stderr, "fuzz: needs --mutate SECONDS > 0 or --runs N > 0 (one of them) and a corpus directory "
                         "with files\n");
    return 2;
  }
  std::filesystem::create_directories(artifacts);
  g_hang_path = artifacts + "/hang";
  // An allocation past 8 GiB of address space fails (std::bad_alloc, uncaught: a crash, its input
  // kept) instead of swapping the machine: a few bytes must not ask for gigabytes.
  const rlimit limit{8ull << 30, 8ull << 30};
  ::setrlimit(RLIMIT_AS, &limit);
  ::signal(SIGALRM, on_alarm);
  std::mt19937_64 rng(seed);
  const std::string current = artifacts + "/current";
  const auto start = std::chrono::steady_clock::now();
  size_t runs = 0;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (runs_wanted > 0 ? runs < runs_wanted : elapsed() < seconds) {
    Bytes input = mutate(corpus[rng() % corpus.size()], corpus[rng() % corpus.size()], rng);
    write_bytes(current, input);
    g_running = &input;
    ::alarm(10);
    LLVMFuzzerTestOneInput(input.data(), input.size());
    ::alarm(0);
    ++runs;
  }
  std::filesystem::remove(current);
  std::printf("fuzz: %zu mutants of %zu corpus files in %.0f s (seed %llu): no crash, no hang\n", runs, files,
              elapsed(), static_cast<unsigned long long>(seed));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--mutate" || std::string(argv[i]) == "--runs") return mutate_main(argc, argv);
  }
  size_t inputs = 0;
  for (const Bytes& input : read_corpus(std::vector<std::string>(argv + 1, argv + argc), &inputs)) {
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("replayed %zu inputs\n", inputs);
  return inputs > 0 ? 0 : 1;
}
