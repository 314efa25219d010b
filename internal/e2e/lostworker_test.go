package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/jobs"
)

// runReaper runs the control plane's lease reaper once, through River,
// and waits for it to complete.
func (e *env) runReaper() {
	e.t.Helper()
	ins, err := river.NewClient[pgx.Tx](riverpgxv5.New(e.pool), &river.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	// One reaper per 30 s is unique: the run at start would stand in for
	// this one, so the earlier runs go once they are done.
	var job *rivertype.JobInsertResult
	eventually(e.t, "the reaper to be inserted", func() bool {
		if _, err := e.pool.Exec(e.t.Context(), `DELETE FROM river_job WHERE kind = $1 AND state <> 'running'`, jobs.LeaseReaperArgs{}.Kind()); err != nil {
			e.t.Fatal(err)
		}
		job, err = ins.Insert(e.t.Context(), jobs.LeaseReaperArgs{}, nil)
		if err != nil {
			e.t.Fatalf("insert the reaper: %v", err)
		}
		return !job.UniqueSkippedAsDuplicate
	})
	eventually(e.t, "the reaper to run", func() bool {
		var state string
		if err := e.pool.QueryRow(e.t.Context(), `SELECT state FROM river_job WHERE id = $1`, job.Job.ID).Scan(&state); err != nil {
			e.t.Fatal(err)
		}
		return state == "completed"
	})
}

// TestKilledWorkerRequestsRecorded: a worker serving two streams on a
// cap-2 account and holding eight more requests for it dies. Each of the
// ten requests is recorded once, under the id its client got (the
// streams' clients have theirs in their response headers): the worker
// recorded each as in progress when it was first held or leased, and the
// reaper closes what nobody renews any more as worker_lost, within a
// lease TTL of the death plus one reaper run, not at the leases' 10-minute
// grace.
func TestKilledWorkerRequestsRecorded(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	clk := clock.NewManual(time.Now().Truncate(time.Second))
	e := setup(t, options{
		accounts:    []account{{label: "capped", maxConc: 2}},
		leaseTTL:    ttl,
		now:         clk.Now,
		deltaDelay:  time.Hour,
		keyCacheTTL: time.Hour,
		hold:        time.Hour,
		jobs:        true,
		noDataplane: true,
	})
	cut := &killable{base: rpcclient.HTTPClient().Transport}
	_, w := e.newDataplane(&http.Client{Transport: cut})

	var streamIDs []string
	for range 2 {
		streamIDs = append(streamIDs, e.startStream(w.Client(), w.URL).res.Header.Get("Weir-Request-Id"))
	}
	for range 8 {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, w.URL+"/v1/messages", strings.NewReader(messagesBody(false)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", e.key)
		go func() {
			if res, err := w.Client().Do(req); err == nil { // it dies with the worker
				res.Body.Close()
			}
		}()
	}
	count := func(where string) int {
		var n int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM route_events WHERE `+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, "the worker to record its ten requests as in progress", func() bool {
		return count(`pending_until IS NOT NULL`) == 10
	})

	// The worker dies: no call of it reaches the control plane again.
	cut.cutOff()
	w.CloseClientConnections()
	e.advanceAlive(clk, ttl+time.Second)
	e.runReaper()

	if n := count(`error_type = 'worker_lost' AND pending_until IS NULL`); n != 10 {
		t.Errorf("%d requests recorded as worker_lost, want 10", n)
	}
	if n := count(`true`); n != 10 {
		t.Errorf("%d route events, want one per request (10)", n)
	}
	for _, id := range streamIDs {
		if ev := e.routeEvent(id); ev.ErrorType != "worker_lost" || !ev.Stream || ev.Pending {
			t.Errorf("stream %s recorded as %v", id, ev)
		}
	}
}
