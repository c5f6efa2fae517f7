// A script cell's fields (`script:` and the few run fields a script takes) and its expectations
// (`exit`, `output`, `exception`, `hang`).  Internal to scenario/.
#include <filesystem>
#include <regex>

#include "scenario/parse.h"

namespace dmpcheck::scenario {
namespace detail {
namespace {

// A script's first run on a release imports torch, fbgemm and TorchRec in every rank: minutes on a
// loaded machine, not the seconds a scenario cell's ranks need once warm.
constexpr double kScriptTimeout = 300.0;

// The run fields a script cell takes; the rest describe a model the script builds itself.
const std::vector<std::string> kScriptRunKeys = {"system", "world_size", "timeout_s", "threads_per_rank", "script"};

// A string handed to execve (an argument, NAME=value): a NUL would cut it there, and one over
// MAX_ARG_STRLEN (128 KiB) makes execve fail with E2BIG, so both are refused where they are written.
void check_exec_string(const Reader& r, const YAML::Node& node, const std::string& field, const std::string& text) {
  constexpr size_t kMaxArgStrlen = 131072;  // Linux: 32 pages, the terminating NUL included
  if (text.find('\0') != std::string::npos) r.fail(node, field, "holds a NUL character, which execve would cut it at");
  if (text.size() + 1 > kMaxArgStrlen) {
    r.fail(node, field,
           fmt::format("is {} bytes; Linux's execve takes at most {} per argument or NAME=value (E2BIG)", text.size(),
                       kMaxArgStrlen - 1));
  }
}

ScriptSpec parse_script(const Reader& r, const YAML::Node& node) {
  ScriptSpec s;
  if (node.IsScalar()) {
    s.path = r.path(node, "script");
  } else {
    r.check_keys(node, "script", {"path", "args", "env", "audit"});
    s.path = r.path(r.required(node, "script", "path"), "script.path");
    if (node["args"]) {
      s.args = r.string_list(node["args"], "script.args");
      for (size_t i = 0; i < s.args.size(); ++i) {
        check_exec_string(r, node["args"][i], fmt::format("script.args[{}]", i), s.args[i]);
      }
    }
    if (YAML::Node env = node["env"]) {
      r.require_map(env, "script.env");
      for (const auto& kv : env) {
        const std::string name = kv.first.as<std::string>();
        if (name.find('\0') != std::string::npos) {
          r.fail(kv.first, "script.env", "a variable's name holds a NUL character");
        }
        const std::string field = "script.env." + name;
        static const std::regex kName("[A-Za-z_][A-Za-z0-9_]*");
        if (!std::regex_match(name, kName)) r.fail(kv.first, field, "expected an environment variable's name");
        // The launcher's own names: a script that set them would not be run as torchrun runs it.
        static const std::vector<std::string> kOurs = {
            "RANK",        "WORLD_SIZE", "LOCAL_RANK",         "LOCAL_WORLD_SIZE",        "MASTER_ADDR",
            "MASTER_PORT", "PYTHONPATH", "DMPCHECK_AUDIT_DIR", "DMPCHECK_RENDEZVOUS_FILE"};
        if (std::find(kOurs.begin(), kOurs.end(), name) != kOurs.end())
          r.fail(kv.first, field, "is set by dmpcheck for every rank (as torchrun sets it); the script cannot");
        if (!kv.second.IsScalar()) r.expected(kv.second, field, "a string");
        check_exec_string(r, kv.second, field, name + "=" + kv.second.Scalar());
        s.env[name] = kv.second.Scalar();
      }
    }
    if (node["audit"]) s.audit = r.choice(node["audit"], "script.audit", {"true", "false"}) == "true";
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(s.path, ec)) {
    r.fail(node.IsScalar() ? node : node["path"], "script.path", fmt::format("no script file {}", s.path));
  }
  return s;
}

}  // namespace

RunSpec parse_script_run(const Reader& r, const YAML::Node& root) {
  RunSpec run;
  run.timeout_s = kScriptTimeout;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(kMatrixRoots.begin(), kMatrixRoots.end(), key) == kMatrixRoots.end() && key != "script") continue;
    if (std::find(kScriptRunKeys.begin(), kScriptRunKeys.end(), key) == kScriptRunKeys.end()) {
      r.fail(kv.first, key,
             fmt::format("describes a model dmpcheck builds; a script cell runs the script's own (it takes {})",
                         fmt::join(kScriptRunKeys, ", ")));
    }
  }
  parse_process_fields(r, root, run);  // the fields of the processes, read as a scenario cell's
  r.section([&] { run.script = parse_script(r, root["script"]); });
  if (!run.on_torchrec()) {
    r.fail(root["system"] ? root["system"] : root["script"], "system",
           "a script cell runs Python under TorchRec: a release (torchrec==X.Y.Z), a commit (torchrec@<rev>) or an "
           "interpreter (python:/path); the reference runs scenario cells only");
  }
  return run;
}

void parse_script_expectation(const Reader& r, const YAML::Node& node, const std::string& path, ScriptExpectation& e) {
  auto rank_of = [&](const YAML::Node& map, const std::string& at) -> std::optional<int> {
    if (!map["rank"]) return std::nullopt;
    return static_cast<int>(r.integer(map["rank"], at + ".rank", 0, 63));
  };
  if (YAML::Node exit = node["exit"]) {
    const std::string at = path + ".exit";
    // (A YAML::Node assigned to is the node it refers to changed: bind, never assign.)
    if (exit.IsMap()) r.check_keys(exit, at, {"status", "rank"});
    const YAML::Node status = exit.IsMap() ? r.required(exit, at, "status") : exit;
    if (exit.IsMap()) e.exit_rank = rank_of(exit, at);
    const std::string word = status.IsScalar() ? status.Scalar() : std::string();
    e.exit_status = word == "nonzero" ? ScriptExpectation::kNonzero
                    : word == "any"   ? ScriptExpectation::kAny
                                      : static_cast<int>(r.integer(status, exit.IsMap() ? at + ".status" : at, 0, 255));
  }
  if (YAML::Node output = node["output"]) {
    const std::string at = path + ".output";
    if (!output.IsSequence()) r.expected(output, at, "a list of {contains | lacks | matches: TEXT, rank: R}");
    for (size_t i = 0; i < output.size(); ++i) {
      const std::string item = fmt::format("{}[{}]", at, i);
      r.check_keys(output[i], item, {"contains", "lacks", "matches", "rank"});
      ScriptExpectation::Output o;
      for (const char* test : {"contains", "lacks", "matches"}) {
        if (!output[i][test]) continue;
        if (!o.test.empty()) r.fail(output[i], item, "give one of contains, lacks, matches");
        o.test = test;
        o.text = r.string(output[i][test], item + "." + test);
      }
      if (o.test.empty()) r.fail(output[i], item, "give one of contains, lacks, matches");
      if (o.test == "matches") {
        try {
          std::regex check(o.text, std::regex::ECMAScript);
        } catch (const std::regex_error& err) {
          r.fail(output[i]["matches"], item + ".matches", fmt::format("not a regular expression: {}", err.what()));
        }
      }
      o.rank = rank_of(output[i], item);
      e.output.push_back(o);
    }
  }
  if (YAML::Node exception = node["exception"]) {
    const std::string at = path + ".exception";
    r.check_keys(exception, at, {"type", "message", "rank"});
    ScriptExpectation::Exception x;
    x.type = r.string(r.required(exception, at, "type"), at + ".type");
    if (exception["message"]) x.message = r.string(exception["message"], at + ".message");
    x.rank = rank_of(exception, at);
    e.exception = x;
  }
  if (node["hang"]) e.hang = r.choice(node["hang"], path + ".hang", {"true", "false"}) == "true";
}

void check_script_expectation(const Reader& r, const YAML::Node& node, const std::string& path, const RunSpec& run,
                              bool script) {
  static const std::vector<std::string> kScriptKeys = {"when", "replicas", "diverged",  "at",
                                                       "exit", "output",   "exception", "hang"};
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const bool script_only = key == "exit" || key == "output" || key == "exception" || key == "hang";
    if (script && std::find(kScriptKeys.begin(), kScriptKeys.end(), key) == kScriptKeys.end()) {
      r.fail(kv.first, path + "." + key,
             fmt::format("is not judged on a script cell (run '{}'); a script cell judges {}", run.name,
                         fmt::join(std::vector<std::string>(kScriptKeys.begin() + 1, kScriptKeys.end()), ", ")));
    }
    if (!script && script_only) {
      r.fail(kv.first, path + "." + key, fmt::format("judges a script cell; run '{}' has no 'script'", run.name));
    }
  }
  const auto& e = run.expect.script;
  auto within = [&](std::optional<int> rank, const YAML::Node& at, const std::string& field) {
    if (rank && *rank >= run.world_size) {
      r.fail(at, field, fmt::format("rank {} of run '{}', which has {} rank(s)", *rank, run.name, run.world_size));
    }
  };
  within(e.exit_rank, node["exit"], path + ".exit.rank");
  for (size_t i = 0; i < e.output.size(); ++i)
    within(e.output[i].rank, node["output"][i], fmt::format("{}.output[{}].rank", path, i));
  if (e.exception) within(e.exception->rank, node["exception"], path + ".exception.rank");
  if (e.hang && e.exit_status) r.fail(node["hang"], path + ".hang", "a hung rank has no exit status; give one of them");
}

}  // namespace detail

std::string ScriptExpectation::describe() const {
  std::vector<std::string> parts;
  if (exit_status) {
    parts.push_back(fmt::format("{} exit{}", exit_rank ? fmt::format("rank {}", *exit_rank) : "every rank",
                                *exit_status == kNonzero ? "s non-zero"
                                : *exit_status == kAny   ? "s by itself, with any status"
                                                         : fmt::format("s {}", *exit_status)));
  }
  for (const auto& o : output) {
    parts.push_back(fmt::format("{} output {} '{}'", o.rank ? fmt::format("rank {}'s", *o.rank) : "the",
                                o.test == "lacks" ? "lacks" : o.test, o.text));
  }
  if (exception) {
    parts.push_back(fmt::format("{} raises {}{}", exception->rank ? fmt::format("rank {}", *exception->rank) : "a rank",
                                exception->type,
                                exception->message.empty() ? "" : " containing '" + exception->message + "'"));
  }
  if (hang) parts.push_back("a rank hangs past timeout_s");
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace dmpcheck::scenario
