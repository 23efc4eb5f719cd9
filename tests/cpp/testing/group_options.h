// ElasticGroupOptions for tests (test-only, header-only; like
// tests/cpp/testing/status_matchers.h, it is not installed):
//
//   auto g = comm::ElasticGroup::Join(store, comm::testing::GroupOptions("job", "m0", 2));
//
// The rendezvous and heartbeat timeouts are long enough for ranks as threads
// or processes on a loaded 2-core machine and short enough that a test that
// goes wrong fails instead of hanging. Thread-safety: a pure function.
#ifndef MALLE_TESTS_CPP_TESTING_GROUP_OPTIONS_H_
#define MALLE_TESTS_CPP_TESTING_GROUP_OPTIONS_H_

#include <string>

#include "absl/time/time.h"
#include "libmalle/comm/elastic_group.h"

namespace malle::comm::testing {

inline ElasticGroupOptions GroupOptions(const std::string& job, const std::string& member,
                                        int bootstrap) {
  ElasticGroupOptions o;
  o.job_id = job;
  o.member_id = member;
  o.bootstrap_size = bootstrap;
  o.rendezvous_timeout = absl::Seconds(20);
  o.heartbeat_timeout = absl::Seconds(5);
  return o;
}

}  // namespace malle::comm::testing

#endif  // MALLE_TESTS_CPP_TESTING_GROUP_OPTIONS_H_
