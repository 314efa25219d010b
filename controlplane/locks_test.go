package controlplane

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestAccountLocksLetReferencingInsertsBe: a worker's batch of route events
// holds KEY SHARE locks on its accounts (the foreign keys) until it
// commits, taken in the batch's order. A success record and a claim lock
// an account row too; if either waited for those locks, a success batch
// locking accounts in id order and a route batch locking them in another
// deadlocked, and Postgres took a second to break it while every Acquire
// and Release of those accounts waited. Both go ahead now with the route
// batch still open.
func TestAccountLocksLetReferencingInsertsBe(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, key := e.createKey("")
	a, _ := e.createAccount(acct{})
	id := uuid.MustParse(a.Id)
	now := e.clock.Now()

	tx, err := e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // test cleanup
	row := db.RouteEvent{RequestID: "weir_open", AccountID: uuid.NullUUID{UUID: id, Valid: true}, Surface: "messages",
		Model: "m", Status: 200, StartedAt: now, AttemptsJson: []byte("[]")}
	if _, err := db.New(tx).InsertRouteEvents(t.Context(), routeColumns([]db.RouteEvent{row}, now, now)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var berr error
	e.q.RecordReleaseSuccess(ctx, []db.RecordReleaseSuccessParams{{Now: now, AccountID: id, AdmittedAt: now,
		RewriteBefore: now, Provider: "anthropic"}}).QueryRow(func(_ int, _ db.RecordReleaseSuccessRow, err error) {
		berr = err
	})
	if berr != nil {
		t.Fatalf("a success record waited for an open route batch: %v", berr)
	}
	resp, err := e.dp.leases.Acquire(ctx, connect.NewRequest(&weirv1.AcquireRequest{KeyHash: key, RequestId: "req-open"}))
	if err != nil || resp.Msg.GetLease() == nil {
		t.Fatalf("a claim waited for an open route batch: %v %v", err, resp)
	}
}
