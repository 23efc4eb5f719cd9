#include "libmalle/elastic/launch_session.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "libmalle/base/status_macros.h"
#include "libmalle/comm/control_store.h"

namespace malle::elastic {

LaunchSession::LaunchSession(const cluster::LaunchEnv& launch, std::shared_ptr<comm::ControlStore> hosted)
    : store_host_(launch.rank.store_host()),
      store_port_(launch.rank.store_port()),
      closed_key_(launch.launcher == cluster::Launcher::kMalle
                      ? std::string()
                      : absl::StrCat(comm::JobPrefix(launch.rank.job_id), "closed")),
      hosted_(std::move(hosted)) {}

absl::StatusOr<std::unique_ptr<LaunchSession>> LaunchSession::Open(const cluster::LaunchEnv& launch,
                                                                   absl::Duration timeout) {
  std::shared_ptr<comm::ControlStore> hosted;
  if (launch.host_store) {
    absl::StatusOr<std::shared_ptr<comm::ControlStore>> h =
        comm::ControlStore::Host(launch.store_bind, launch.rank.store_port(), timeout);
    if (!h.ok()) {
      absl::Status s(h.status().code(),
                     absl::StrCat(h.status().message(), " (rank 0 of this ", cluster::LauncherName(launch.launcher),
                                  " job hosts the control store at ", launch.rank.store, ", from ", launch.store_from,
                                  "; set MASTER_PORT to choose another port)"));
      s.SetPayload(comm::kErrorClassPayload, absl::Cord("StoreError"));  // whatever the code: the store failed
      return s;
    }
    hosted = *std::move(h);
  }
  return std::unique_ptr<LaunchSession>(new LaunchSession(launch, std::move(hosted)));
}

absl::Status LaunchSession::Close(int size, absl::Duration timeout) {
  if (closed_ || closed_key_.empty()) return absl::OkStatus();
  closed_ = true;
  // The server stops when the last handle goes, whatever happens below.
  std::shared_ptr<comm::ControlStore> hosted = std::move(hosted_);
  if (hosted == nullptr) {
    MALLE_ASSIGN_OR_RETURN(std::shared_ptr<comm::ControlStore> store,
                           comm::ControlStore::Connect(store_host_, store_port_, timeout));
    return store->Add(closed_key_, 1).status();
  }
  MALLE_ASSIGN_OR_RETURN(int64_t closed, hosted->Add(closed_key_, 1));
  const absl::Time deadline = absl::Now() + timeout;
  while (closed < size && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    MALLE_ASSIGN_OR_RETURN(closed, hosted->Add(closed_key_, 0));
  }
  if (closed < size) {
    return absl::DeadlineExceededError(absl::StrCat("closing the control store this process hosts with ",
                                                    size - closed, " of ", size, " members not closed after ",
                                                    absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace malle::elastic
