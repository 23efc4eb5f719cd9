#include "libmalle/elastic/job_env.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace malle::elastic {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string GeneratedMemberId() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string clean;
  for (const char* p = host; *p && clean.size() < 40; ++p) {
    if (std::isalnum(static_cast<unsigned char>(*p)) || *p == '-') clean.push_back(*p);
  }
  if (clean.empty()) clean = "host";
  std::random_device rd;
  return absl::StrFormat("%s-%d-%08x", clean, ::getpid(), rd());
}

}  // namespace

comm::ElasticGroupOptions JobEnv::GroupOptions() const {
  comm::ElasticGroupOptions o;
  o.job_id = job_id;
  o.member_id = member_id;
  o.bootstrap_size = bootstrap_size;
  return o;
}

absl::StatusOr<JobEnv> ReadJobEnv() {
  JobEnv env;
  const std::string addr = Env("MALLE_STORE");
  if (addr.empty()) {
    return absl::InvalidArgumentError(
        "MALLE_STORE: no control store given; run under `malletrain local` (which sets MALLE_STORE, "
        "MALLE_JOB_ID, MALLE_MEMBER_ID and MALLE_BOOTSTRAP_SIZE) or set MALLE_STORE=host:port");
  }
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(addr.substr(colon + 1), &env.store_port) || env.store_port <= 0 ||
      env.store_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MALLE_STORE: expected 'host:port', got '", addr, "'"));
  }
  env.store_host = addr.substr(0, colon);
  const std::string job = Env("MALLE_JOB_ID");
  if (!job.empty()) env.job_id = job;
  env.member_id = Env("MALLE_MEMBER_ID");
  if (env.member_id.empty()) env.member_id = GeneratedMemberId();
  const std::string boot = Env("MALLE_BOOTSTRAP_SIZE");
  if (!boot.empty() && (!absl::SimpleAtoi(boot, &env.bootstrap_size) || env.bootstrap_size < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MALLE_BOOTSTRAP_SIZE: must be a non-negative integer, got '", boot, "'"));
  }
  return env;
}

absl::StatusOr<std::shared_ptr<comm::ControlStore>> ConnectStore(const JobEnv& env, absl::Duration timeout) {
  return comm::ControlStore::Connect(env.store_host, env.store_port, timeout);
}

}  // namespace malle::elastic
