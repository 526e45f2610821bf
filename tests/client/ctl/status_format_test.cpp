// The pure formatting behind smddp-ctl: text report, health verdict, Prometheus output, socket names.
#include "client/ctl/status_format.hpp"

#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

using nlohmann::json;
using namespace smddp::ctl;

json full_status() {
  return json::parse(R"({"version":"0.1.0","job_id":"j1","node_id":0,"num_nodes":1,"pid":123,"state":"ready",
    "uptime_s":12.3,"config":"configs/local.ini","transport":"none","hostname":"h",
    "world_size":4,"local_world_size":4,
    "ranks":[{"rank":0,"local_rank":0,"pid":4567,"device":"cpu","state":"registered","alive":true,
              "exit_status":null,"last_seq_posted":12,"pending":1},
             {"rank":1,"local_rank":1,"pid":4568,"device":"cpu","state":"registered","alive":true,
              "exit_status":null,"last_seq_posted":11,"pending":0}],
    "collectives_done":100,"bytes_moved":123456,"kernel_launches":0,"recent_bandwidth_gbps":1.25,
    "errors":[{"time":"2026-11-30T00:00:00Z","message":"rank 3 sent a bad descriptor"}],
    "stalls":[],
    "job_error":""})");
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Checks text exposition format 0.0.4 as Prometheus parses it: HELP/TYPE at most once per family and
// before its samples, each family's samples together, valid names, labels and values, no duplicate
// series, counters named *_total. Returns the problems found.
std::vector<std::string> prometheus_problems(const std::string& text) {
  static const std::regex kSample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")"
      R"((?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? (\S+)$)");
  static const std::regex kMeta(R"(^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$)");
  std::vector<std::string> problems;
  if (!text.empty() && text.back() != '\n') problems.push_back("does not end in a newline");
  std::map<std::string, std::string> types;
  std::set<std::string> helps, finished, series;
  std::string current;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, kMeta)) {
      const std::string name = m[2];
      if (m[1] == "HELP") {
        if (!helps.insert(name).second) problems.push_back("second HELP for " + name);
      } else {
        const std::string type = m[3];
        if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped")
          problems.push_back("bad type in: " + line);
        if (types.count(name) != 0) problems.push_back("second TYPE for " + name);
        if (finished.count(name) != 0 || current == name) problems.push_back("TYPE after samples of " + name);
        if (type == "counter" && !name.ends_with("_total")) problems.push_back("counter not named *_total: " + name);
        types[name] = type;
      }
    } else if (std::regex_match(line, m, kSample)) {
      const std::string name = m[1];
      if (types.count(name) == 0) problems.push_back("sample before its TYPE: " + line);
      if (name != current) {
        if (finished.count(name) != 0) problems.push_back("samples of " + name + " are not together");
        if (!current.empty()) finished.insert(current);
        current = name;
      }
      if (!series.insert(name + std::string(m[2])).second) problems.push_back("duplicate series: " + line);
      const std::string value = m[3];
      if (value != "NaN" && value != "+Inf" && value != "-Inf") {
        char* end = nullptr;
        std::strtod(value.c_str(), &end);
        if (end != value.c_str() + value.size()) problems.push_back("bad value in: " + line);
      }
    } else {
      problems.push_back("not a valid line: '" + line + "'");
    }
  }
  return problems;
}

TEST(Health, FullExampleIsHealthy) {
  auto v = evaluate_health(full_status());
  EXPECT_EQ(v.health, Health::kHealthy) << v.reason;
  EXPECT_TRUE(contains(v.reason, "2 of 2 local ranks alive")) << v.reason;
}

TEST(Health, MinimalReadyIsHealthy) {
  EXPECT_EQ(evaluate_health(json{{"state", "ready"}}).health, Health::kHealthy);
}

TEST(Health, EachProblemDegrades) {
  struct Case {
    const char* what;
    std::function<void(json&)> change;
    const char* reason;
  };
  std::vector<Case> cases = {
      {"starting", [](json& s) { s["state"] = "starting"; }, "daemon state is starting"},
      {"no state", [](json& s) { s.erase("state"); }, "daemon state unknown"},
      {"job error", [](json& s) { s["job_error"] = "rank 1 exited with status 1"; }, "job error: rank 1 exited"},
      {"dead rank", [](json& s) { s["ranks"][1]["alive"] = false; }, "rank 1 (pid 4568) is not alive"},
      {"stopped rank", [](json& s) { s["ranks"][1]["stopped"] = true; },
       "rank 1 (pid 4568) is stopped (a signal or a debugger)"},
      {"failed rank",
       [](json& s) {
         s["ranks"][0]["state"] = "failed";
         s["ranks"][0]["exit_status"] = "signal 9";
       },
       "rank 0 (pid 4567) failed (exit status signal 9)"},
      {"stall",
       [](json& s) {
         s["stalls"] = json::parse(R"([{"comm_id":0,"seq":5,"op":"allreduce","waiting_s":61.2,"missing_ranks":[2,3]}])");
       },
       "stalled: allreduce seq 5 on comm 0 waiting 61.2 s for ranks 2, 3"},
      {"daemon error", [](json& s) { s["error"] = "the daemon could not build its status"; }, "could not build"},
  };
  for (const auto& c : cases) {
    json s = full_status();
    c.change(s);
    auto v = evaluate_health(s);
    EXPECT_EQ(v.health, Health::kDegraded) << c.what;
    EXPECT_TRUE(contains(v.reason, c.reason)) << c.what << ": " << v.reason;
    EXPECT_FALSE(contains(v.reason, "\n")) << c.what;
  }
}

TEST(Health, SeveralProblemsInOneLine) {
  json s = full_status();
  s["state"] = "failed";
  s["ranks"][0]["alive"] = false;
  auto v = evaluate_health(s);
  EXPECT_EQ(v.health, Health::kDegraded);
  EXPECT_EQ(v.reason, "daemon state is failed; rank 0 (pid 4567) is not alive");
}

TEST(Health, WrongTypesDoNotThrow) {
  json s = json::parse(R"({"state":7,"ranks":"many","stalls":{"a":1},"job_error":null,"errors":5})");
  auto v = evaluate_health(s);
  EXPECT_EQ(v.health, Health::kDegraded);  // a state that is not "ready"
  EXPECT_EQ(evaluate_health(json::array()).health, Health::kUnreachable);
  json odd_ranks = json::parse(R"({"state":"ready","ranks":[1,"x",null,{"alive":"yes"}]})");
  EXPECT_EQ(evaluate_health(odd_ranks).health, Health::kHealthy);
}

TEST(Text, FullExample) {
  std::string t = format_status_text(full_status());
  for (const char* s : {"job j1, node 0 of 1 (host h, daemon pid 123)", "ready, up 12.3 s (healthy)", "configs/local.ini",
                        "4 ranks, 4 on this node", "100 done", "120.6 KiB (123456 B)", "1.25 GB/s", "RANK", "LAST SEQ",
                        "4567", "4568", "stalls:        none", "2026-11-30T00:00:00Z  rank 3 sent a bad descriptor"})
    EXPECT_TRUE(contains(t, s)) << "missing '" << s << "' in\n" << t;
  EXPECT_FALSE(contains(t, "degraded")) << t;
}

TEST(Text, GpuBlockShowsOperationsAndPeerMappings) {
  auto s = full_status();
  s["gpu"] = json::parse(R"({"enabled":true,"devices":"rank-side execution","rank_side_operations":30,
    "fast_path_operations":20,"kernel_launches":25,"copies":4,"operations_by_op":{"allreduce":30},
    "kernel_launches_by_op":{"allreduce":25},"peer_mappings":6,"freed_allocations":17})");
  const auto text = format_status_text(s);
  EXPECT_TRUE(contains(text, "rank-side operations: 30, of which fast path 20")) << text;
  EXPECT_TRUE(contains(text, "allreduce: 30 ops, 25 kernel launches (0.83 per op)")) << text;
  EXPECT_TRUE(contains(text, "peer mappings: 6 (other ranks' allocations sent to a rank; 17 freed")) << text;
  s["gpu"] = json::parse(R"({"enabled":false,"why":"no CUDA"})");
  EXPECT_TRUE(contains(format_status_text(s), "gpu:           off (no CUDA)"));
}

TEST(Text, AcrossNodesShowsOperationsInFlightAndStaging) {
  auto s = full_status();
  s["internode"] = json::parse(R"({"enabled":true,"operations_in_flight":3,"staging_buffers_made":12,
    "staging_bytes_kept":6291456})");
  const auto text = format_status_text(s);
  EXPECT_TRUE(contains(text, "across nodes:  3 operations in flight; staging 12 buffers made, 6.0 MiB (6291456 B) kept for reuse"))
      << text;
  s["internode"] = json::parse(R"({"enabled":false})");  // one node: no line
  EXPECT_FALSE(contains(format_status_text(s), "across nodes")) << format_status_text(s);
  const std::string p = format_prometheus({{"j1", 0, [&] {
                                              auto t = full_status();
                                              t["internode"] = json::parse(
                                                  R"({"enabled":true,"operations_in_flight":3,"staging_bytes_kept":4096})");
                                              return t;
                                            }()}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_internode_operations_in_flight{job=\"j1\",node=\"0\"} 3\n")) << p;
  EXPECT_TRUE(contains(p, "smddp_internode_staging_bytes_kept{job=\"j1\",node=\"0\"} 4096\n")) << p;
}

// The fabric endpoints across nodes: count, provider, each one's device and bytes both ways.
TEST(Text, FabricEndpointsShowTheirDevicesAndBytes) {
  auto s = full_status();
  s["internode"] = json::parse(R"({"enabled":true,"operations_in_flight":0,"staging_buffers_made":0,
    "staging_bytes_kept":0,"fabric":{"provider":"efa","endpoint_count":2,"endpoint_of_slot":[0,0,1,1],
    "endpoints":[{"index":0,"device":"rdmap16s27-rdm","pci":"0000:10:1b.0","address":"fi_addr_efa://[fe80::1]:0:1",
                  "bytes_sent":1048576,"bytes_received":2048},
                 {"index":1,"device":"rdmap32s27-rdm","pci":"","address":"x","bytes_sent":0,"bytes_received":5}]}})");
  const auto text = format_status_text(s);
  EXPECT_TRUE(contains(text, "fabric:        2 endpoint(s), provider efa; endpoint of each local slot: 0 0 1 1\n")) << text;
  EXPECT_TRUE(contains(text, "ENDPOINT")) << text;
  EXPECT_TRUE(contains(text, "rdmap16s27-rdm")) << text;
  EXPECT_TRUE(contains(text, "0000:10:1b.0")) << text;
  EXPECT_TRUE(contains(text, "1.0 MiB")) << text;
  const std::string p = format_prometheus({{"j1", 0, s}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_fabric_endpoints{job=\"j1\",node=\"0\"} 2\n")) << p;
  EXPECT_TRUE(contains(p, "smddp_fabric_endpoint_bytes_sent_total{job=\"j1\",node=\"0\",endpoint=\"0\",device=\"rdmap16s27-rdm\"} 1048576\n"))
      << p;
  EXPECT_TRUE(contains(p, "smddp_fabric_endpoint_bytes_received_total{job=\"j1\",node=\"0\",endpoint=\"1\",device=\"rdmap32s27-rdm\"} 5\n"))
      << p;
  s["internode"] = json::parse(R"({"enabled":true,"operations_in_flight":0})");  // an older daemon: no fabric block
  EXPECT_FALSE(contains(format_status_text(s), "fabric:")) << format_status_text(s);
  EXPECT_EQ(prometheus_problems(format_prometheus({{"j1", 0, s}})), std::vector<std::string>{});
}

// Where the bytes go: GPU<->arena copies by op and rank, the daemon's reductions, fabric sends.
TEST(Text, TrafficShowsBytesByOpAndRank) {
  auto s = full_status();
  s["traffic"] = json::parse(R"({"by_op":{
      "allreduce":{"to_host_bytes":33554432,"to_device_bytes":33554432,"daemon_reduced_bytes":16777216,
                   "fabric_sent_bytes":8389632},
      "broadcast":{"to_host_bytes":0,"to_device_bytes":0,"daemon_reduced_bytes":0,"fabric_sent_bytes":512}},
    "by_rank":[{"rank":0,"to_host_bytes":33554432,"to_device_bytes":33554432,
                "by_op":{"allreduce":{"to_host_bytes":33554432,"to_device_bytes":33554432}}},
               {"rank":1,"to_host_bytes":0,"to_device_bytes":0,"by_op":{}}]})");
  const auto text = format_status_text(s);
  EXPECT_TRUE(contains(text, "  traffic:\n")) << text;
  EXPECT_TRUE(contains(text, "REDUCED BY DAEMON")) << text;
  EXPECT_TRUE(contains(text, "32.0 MiB (33554432 B)")) << text;
  EXPECT_TRUE(contains(text, "16.0 MiB (16777216 B)")) << text;
  EXPECT_TRUE(contains(text, "512 B")) << text;
  // A rank that copied nothing gets no row of its own.
  EXPECT_FALSE(std::regex_search(text, std::regex(R"(\n +1 +0 B)"))) << text;
  const std::string p = format_prometheus({{"j1", 0, s}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  for (const char* want : {
           "smddp_staged_to_host_bytes_total{job=\"j1\",node=\"0\",rank=\"0\",op=\"allreduce\"} 33554432\n",
           "smddp_staged_to_device_bytes_total{job=\"j1\",node=\"0\",rank=\"0\",op=\"allreduce\"} 33554432\n",
           "smddp_daemon_reduced_bytes_total{job=\"j1\",node=\"0\",op=\"allreduce\"} 16777216\n",
           "smddp_fabric_sent_bytes_total{job=\"j1\",node=\"0\",op=\"allreduce\"} 8389632\n",
           "smddp_fabric_sent_bytes_total{job=\"j1\",node=\"0\",op=\"broadcast\"} 512\n",
           "# TYPE smddp_fabric_sent_bytes_total counter\n",
       })
    EXPECT_TRUE(contains(p, want)) << "missing '" << want << "' in\n" << p;
  // No traffic yet (or an older daemon): no block, and the metrics stay well formed.
  s.erase("traffic");
  EXPECT_FALSE(contains(format_status_text(s), "traffic:")) << format_status_text(s);
  s["traffic"] = json::parse(R"({"by_op":{},"by_rank":[]})");
  EXPECT_FALSE(contains(format_status_text(s), "traffic:")) << format_status_text(s);
  EXPECT_EQ(prometheus_problems(format_prometheus({{"j1", 0, s}})), std::vector<std::string>{});
}

TEST(Text, DirectReadsShowChunksAndCopiesBehind) {
  auto s = full_status();
  s["direct_reads"] = json::parse(R"({"chunks":120,"copies_behind":2})");
  const auto text = format_status_text(s);
  EXPECT_TRUE(contains(text, "direct reads:  120 host chunks copied by the ranks from the members' arenas, 2 copies behind"))
      << text;
  s["direct_reads"] = json::parse(R"({"chunks":0,"copies_behind":0})");  // never used: no line
  EXPECT_FALSE(contains(format_status_text(s), "direct reads")) << format_status_text(s);
  auto t = full_status();
  t["direct_reads"] = json::parse(R"({"chunks":120,"copies_behind":2})");
  const std::string p = format_prometheus({{"j1", 0, t}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_direct_read_chunks_total{job=\"j1\",node=\"0\"} 120\n")) << p;
  EXPECT_TRUE(contains(p, "smddp_direct_read_copies_behind{job=\"j1\",node=\"0\"} 2\n")) << p;
}

// Split host reductions: the line names the size from which allreduce and reduce split (the
// daemon's resolved threshold), the Prometheus lines carry the counts.
TEST(Text, SplitReductionsShowTheirThreshold) {
  auto s = full_status();
  s["split_reductions"] = json::parse(R"({"chunks":800,"shares_behind":1,"min_bytes":65536})");
  const auto text = format_status_text(s);
  EXPECT_TRUE(contains(text, "split reductions: 800 host chunks reduced by the ranks, a share each, from the members' "
                             "arenas (allreduce and reduce from 64 KiB a chunk); 1 shares behind"))
      << text;
  s["split_reductions"] = json::parse(R"({"chunks":800,"shares_behind":0,"min_bytes":null})");  // off: reduce_scatter only
  EXPECT_TRUE(contains(format_status_text(s), "from the members' arenas; 0 shares behind")) << format_status_text(s);
  s["split_reductions"] = json::parse(R"({"chunks":0,"shares_behind":0,"min_bytes":65536})");  // never used: no line
  EXPECT_FALSE(contains(format_status_text(s), "split reductions")) << format_status_text(s);
  auto t = full_status();
  t["split_reductions"] = json::parse(R"({"chunks":800,"shares_behind":1,"min_bytes":65536})");
  const std::string p = format_prometheus({{"j1", 0, t}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_split_reduce_chunks_total{job=\"j1\",node=\"0\"} 800\n")) << p;
  EXPECT_TRUE(contains(p, "smddp_split_reduce_shares_behind{job=\"j1\",node=\"0\"} 1\n")) << p;
}

TEST(Text, RankTableColumnsLineUp) {
  json s = full_status();
  s["ranks"][1]["pid"] = 1234567;
  std::string t = format_status_text(s);
  std::istringstream in(t);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("    ") && !line.starts_with("     ")) rows.push_back(line);
  ASSERT_GE(rows.size(), 3u) << t;
  auto device_col = rows[0].find("DEVICE");
  EXPECT_EQ(rows[1].find("cpu"), device_col) << t;
  EXPECT_EQ(rows[2].find("cpu"), device_col) << t;
}

TEST(Text, StallsNameTheMissingRanks) {
  json s = full_status();
  s["stalls"] = json::parse(R"([{"comm_id":3,"seq":5,"op":"allgather","waiting_s":61.25,"missing_ranks":[2]}])");
  std::string t = format_status_text(s);
  EXPECT_TRUE(contains(t, "stalls (1):")) << t;
  EXPECT_TRUE(contains(t, "allgather seq 5 on comm 3 waiting 61.2 s for rank 2")) << t;
  EXPECT_TRUE(contains(t, "(degraded)")) << t;
}

TEST(Text, MissingFieldsShowAsDashes) {
  std::string t = format_status_text(json::object());
  EXPECT_TRUE(contains(t, "job -, node -")) << t;
  EXPECT_TRUE(contains(t, "none registered")) << t;
  EXPECT_TRUE(contains(t, "degraded:      daemon state unknown")) << t;
  EXPECT_NO_THROW(format_status_text(json::parse(R"({"ranks":[{}],"errors":["plain"],"stalls":[{}]})")));
  EXPECT_NO_THROW(format_status_text(json(42)));
}

TEST(Text, ShowsAStoppedRank) {
  json s = full_status();
  s["ranks"][1]["stopped"] = true;
  std::string t = format_status_text(s);
  EXPECT_TRUE(contains(t, "STOPPED")) << t;
  s["ranks"][1]["stopped"] = false;
  EXPECT_FALSE(contains(format_status_text(s), "STOPPED"));
}

TEST(Text, ShowsADeadRankAndItsExit) {
  json s = full_status();
  s["ranks"][1]["alive"] = false;
  s["ranks"][1]["state"] = "exited";
  s["ranks"][1]["exit_status"] = 1;
  std::string t = format_status_text(s);
  EXPECT_TRUE(contains(t, "NO")) << t;
  EXPECT_TRUE(contains(t, "exited")) << t;
}

TEST(Prometheus, FullExample) {
  std::string p = format_prometheus({{"j1", 0, full_status()}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  for (const char* s : {
           "smddp_up{job=\"j1\",node=\"0\"} 1\n",
           "smddp_collectives_total{job=\"j1\",node=\"0\"} 100\n",
           "smddp_bytes_moved_total{job=\"j1\",node=\"0\"} 123456\n",
           "smddp_kernel_launches_total{job=\"j1\",node=\"0\"} 0\n",
           "smddp_ranks{job=\"j1\",node=\"0\"} 2\n",
           "smddp_ranks_alive{job=\"j1\",node=\"0\"} 2\n",
           "smddp_stalls{job=\"j1\",node=\"0\"} 0\n",
           "smddp_errors_total{job=\"j1\",node=\"0\"} 1\n",
           "smddp_uptime_seconds{job=\"j1\",node=\"0\"} 12.3\n",
           "smddp_recent_bandwidth_gbps{job=\"j1\",node=\"0\"} 1.25\n",
           "smddp_rank_pending{job=\"j1\",node=\"0\",rank=\"0\"} 1\n",
           "smddp_rank_pending{job=\"j1\",node=\"0\",rank=\"1\"} 0\n",
           "smddp_rank_last_seq{job=\"j1\",node=\"0\",rank=\"1\"} 11\n",
           "smddp_healthy{job=\"j1\",node=\"0\"} 1\n",
           "# TYPE smddp_collectives_total counter\n",
           "# TYPE smddp_ranks gauge\n",
           "# HELP smddp_up ",
       })
    EXPECT_TRUE(contains(p, s)) << "missing '" << s << "' in\n" << p;
}

TEST(Prometheus, MissingFieldsLeaveSamplesOut) {
  std::string p = format_prometheus({{"j1", 0, json::object()}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_up{job=\"j1\",node=\"0\"} 1\n")) << p;
  EXPECT_FALSE(contains(p, "smddp_collectives_total{")) << p;
  EXPECT_FALSE(contains(p, "smddp_rank_pending{")) << p;
}

TEST(Prometheus, UnreachableNodeIsDown) {
  std::string p = format_prometheus({{"j1", 0, full_status()}, {"j1", 1, std::nullopt}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_up{job=\"j1\",node=\"1\"} 0\n")) << p;
  EXPECT_FALSE(contains(p, "smddp_collectives_total{job=\"j1\",node=\"1\"}")) << p;
}

TEST(Prometheus, SeveralJobsKeepFamiliesTogether) {
  json degraded = full_status();
  degraded["stalls"] = json::parse(R"([{"comm_id":0,"seq":5,"op":"allreduce","missing_ranks":[1]}])");
  std::string p = format_prometheus({{"a", 0, full_status()}, {"b", 0, degraded}, {"b", 1, std::nullopt}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_stalls{job=\"b\",node=\"0\"} 1\n")) << p;
  EXPECT_TRUE(contains(p, "smddp_healthy{job=\"b\",node=\"0\"} 0\n")) << p;
}

TEST(Prometheus, OddValuesStayWellFormed) {
  json s = json::parse(R"({"state":"re\"a\\dy\n","hostname":"h\"1","ranks":[{"rank":"r\"0","pending":2},{"pending":1}],
    "collectives_done":"many","bytes_moved":1e300,"errors_total":7,"errors":[1]})");
  std::string p = format_prometheus({{"j\"ob", 0, s}});
  EXPECT_EQ(prometheus_problems(p), std::vector<std::string>{}) << p;
  EXPECT_TRUE(contains(p, "smddp_errors_total{job=\"j\\\"ob\",node=\"0\"} 7\n")) << p;
  EXPECT_TRUE(contains(p, "state=\"re\\\"a\\\\dy\\n\"")) << p;
  EXPECT_FALSE(contains(p, "smddp_collectives_total{")) << p;  // not a number
}

TEST(Prometheus, CheckerCatchesMistakes) {
  // The checker above must be able to fail, or the tests using it prove nothing.
  EXPECT_FALSE(prometheus_problems("smddp_x 1\n").empty());                                       // no TYPE
  EXPECT_FALSE(prometheus_problems("# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na 2\n").empty());  // split family
  EXPECT_FALSE(prometheus_problems("# TYPE a gauge\na{x=\"1} 1\n").empty());                     // bad label
  EXPECT_FALSE(prometheus_problems("# TYPE a counter\na 1\n").empty());                          // counter name
  EXPECT_FALSE(prometheus_problems("# TYPE a gauge\na one\n").empty());                          // bad value
  EXPECT_FALSE(prometheus_problems("# TYPE a gauge\na 1\na 1\n").empty());                       // duplicate
}

TEST(Prometheus, Values) {
  EXPECT_EQ(prometheus_value(100), "100");
  EXPECT_EQ(prometheus_value(1.25), "1.25");
  EXPECT_EQ(prometheus_value(0.1), "0.1");
  EXPECT_EQ(prometheus_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(prometheus_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(Helpers, DurationsAndBytes) {
  EXPECT_EQ(format_duration(12.34), "12.3 s");
  EXPECT_EQ(format_duration(303), "5m 03s");
  EXPECT_EQ(format_duration(2 * 3600 + 5 * 60 + 3), "2h 05m 03s");
  EXPECT_EQ(format_duration(3 * 86400 + 2 * 3600 + 5 * 60), "3d 02h 05m");
  EXPECT_EQ(format_duration(-1), "-");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(123456), "120.6 KiB (123456 B)");
  EXPECT_EQ(format_bytes(3.0 * (1ull << 30)), "3.0 GiB (3221225472 B)");
}

TEST(SocketNames, Parse) {
  EXPECT_EQ(parse_socket_name("j1.n0.sock"), (SocketName{"j1", 0}));
  EXPECT_EQ(parse_socket_name("my.job-2.n12.sock"), (SocketName{"my.job-2", 12}));
  EXPECT_EQ(parse_socket_name("a.n1.n3.sock"), (SocketName{"a.n1", 3}));
  for (const char* bad : {"j1.n.sock", "j1.nx.sock", "j1.n-1.sock", "j1.n+1.sock", ".n0.sock", "j1.n0.sock.tmp",
                          "j1.n0", "bad job.n0.sock", "j1.n0x.sock", "j1.n99999999999.sock", ".sock", ""})
    EXPECT_EQ(parse_socket_name(bad), std::nullopt) << bad;
}

}  // namespace
