#include "comm/slurm_env.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>

#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

namespace {

const char* set_value(const EnvLookup& lookup, const char* name) {
  const char* v = lookup(name);
  return v && *v ? v : nullptr;
}

}  // namespace

bool in_slurm_step(const EnvLookup& lookup) {
  return set_value(lookup, "SLURM_STEP_ID") && set_value(lookup, "SLURM_PROCID");
}

std::string slurm_first_host(const std::string& nodelist) {
  // The first entry: up to the first comma outside brackets; in each
  // bracket its first number (zero padding kept).
  std::string host;
  bool in_bracket = false, took = false;
  size_t opened_at = 0;
  for (char c : nodelist) {
    if (!in_bracket && c == ',') break;
    if (c == '[') {
      VQDDP_CHECK(!in_bracket, "Slurm node list '{}': a bracket inside a bracket", nodelist);
      opened_at = host.size();
      in_bracket = true;
      took = false;
    } else if (c == ']') {
      VQDDP_CHECK(in_bracket, "Slurm node list '{}': ']' without '['", nodelist);
      VQDDP_CHECK(host.size() > opened_at, "Slurm node list '{}': a bracket without a first number", nodelist);
      in_bracket = false;
    } else if (!in_bracket) {
      host += c;
    } else if (!took) {
      if (c == ',' || c == '-') {
        VQDDP_CHECK(host.size() > opened_at, "Slurm node list '{}': a bracket without a first number", nodelist);
        took = true;
      } else {
        host += c;
      }
    }
  }
  VQDDP_CHECK(!in_bracket && !host.empty(), "Slurm node list '{}' names no node", nodelist);
  return host;
}

std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // Entries "N" (one node) or "N(xK)" (K nodes), comma-separated.
  size_t at = 0;
  int first = 0;
  while (at < tasks_per_node.size()) {
    size_t end = tasks_per_node.find(',', at);
    if (end == std::string::npos) end = tasks_per_node.size();
    const std::string entry = tasks_per_node.substr(at, end - at);
    const size_t open = entry.find("(x");
    const std::optional<int64_t> tasks = parse_int(entry.substr(0, open));
    int64_t nodes = 1;
    if (open != std::string::npos)
      nodes = entry.back() == ')' ? parse_int(entry.substr(open + 2, entry.size() - open - 3)).value_or(0) : 0;
    VQDDP_CHECK(tasks && *tasks >= 0 && nodes > 0, "SLURM_STEP_TASKS_PER_NODE '{}': '{}' is not N or N(xK)",
                tasks_per_node, entry);
    if (node - first < nodes) return static_cast<int>(*tasks);
    first += static_cast<int>(std::min<int64_t>(nodes, INT32_MAX - first));
    at = end + 1;
  }
  return std::nullopt;
}

EnvLookup with_slurm_step(const EnvLookup& lookup) {
  if (!in_slurm_step(lookup)) return lookup;
  auto derived = std::make_shared<std::map<std::string, std::string>>();
  auto from = [&](const char* name, const char* slurm_name) {
    if (const char* v = set_value(lookup, slurm_name)) (*derived)[name] = v;
  };
  from("RANK", "SLURM_PROCID");
  from("WORLD_SIZE", "SLURM_NTASKS");
  from("WORLD_SIZE", "SLURM_STEP_NUM_TASKS");  // the step's own, where Slurm sets it
  from("LOCAL_RANK", "SLURM_LOCALID");
  if (const char* nodes = set_value(lookup, "SLURM_STEP_NODELIST")) (*derived)["MASTER_ADDR"] = slurm_first_host(nodes);
  if (const char* job = set_value(lookup, "SLURM_JOB_ID")) {
    // One port per job step (two steps of a job may share a first node),
    // below Linux's ephemeral ports (32768 on).
    std::optional<int64_t> id = parse_int(job), step = parse_int(set_value(lookup, "SLURM_STEP_ID"));
    VQDDP_CHECK(id && *id >= 0, "environment variable SLURM_JOB_ID must be a job number, got '{}'", job);
    (*derived)["MASTER_PORT"] = std::to_string(15000 + (*id % 1700) * 10 + (step && *step >= 0 ? *step % 10 : 0));
  }
  const char* per_node = set_value(lookup, "SLURM_STEP_TASKS_PER_NODE");
  const char* node_id = set_value(lookup, "SLURM_NODEID");
  if (per_node && node_id) {
    std::optional<int64_t> node = parse_int(node_id);
    VQDDP_CHECK(node && *node >= 0, "environment variable SLURM_NODEID must be a node number, got '{}'", node_id);
    std::optional<int> here = slurm_tasks_on_node(per_node, static_cast<int>(*node));
    VQDDP_CHECK(here, "SLURM_STEP_TASKS_PER_NODE '{}' has no entry for SLURM_NODEID={}", per_node, *node);
    (*derived)["LOCAL_WORLD_SIZE"] = std::to_string(*here);
  }
  return [lookup, derived](const char* name) -> const char* {
    if (const char* v = set_value(lookup, name)) return v;
    auto it = derived->find(name);
    return it == derived->end() ? lookup(name) : it->second.c_str();
  };
}

std::string slurm_node_name(const EnvLookup& lookup) {
  const char* node = set_value(lookup, "SLURMD_NODENAME");
  return node && in_slurm_step(lookup) ? fmt::format("node {}", node) : "";
}

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

std::string this_node_name() {
  if (std::string node = slurm_node_name(std::getenv); !node.empty()) return node;
  return fmt::format("host {}", host_name());
}

}  // namespace vqddp
