package controlplane

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/weirhq/weir/controlplane/seal"
)

// AccountJobs is the work the River jobs do on accounts, apart from the
// RPCs: usage reads (usage.go), token refresh (oauth.go), banked resets
// (banked.go) and credential checks (credcheck.go, integrity.go,
// accountcheck.go). The replica builds one beside its lease service and
// hands it to the jobs; the account and lease services call the few parts
// they share with it (a manual usage read, a released answer's usage
// headers, a credential found unreadable).
type AccountJobs struct {
	store
	cfg  Config
	seal *seal.Sealer
	log  *slog.Logger
	now  func() time.Time
	// jitter spreads usage reads, uniform in [-1, 1).
	jitter func() float64
	// egress are the clients of calls on an account's behalf, through its
	// egress proxy (egress.go).
	egress egressClients
	// jobsOut inserts jobs without working them (jobs or not, a replica
	// enqueues: another works them).
	jobsOut *river.Client[pgx.Tx]
	// creds checks the stored credentials with this replica's keys.
	creds ticking
}
