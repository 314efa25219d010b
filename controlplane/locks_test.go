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

// TestAccountLocksLetReferencingInsertsBe: an insert that references an
// account by foreign key (an account's history row; route events did too
// until migration 0037) holds a KEY SHARE lock on it until it commits. A
// success record and a claim lock an account row too; if either waited
// for such locks, a success batch locking accounts in id order and an
// insert locking them in another deadlocked, and Postgres took a second
// to break it while every Acquire and Release of those accounts waited.
// Both go ahead now with such an insert, and a route batch, still open.
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
	if err := db.New(tx).InsertAccountHistory(t.Context(), db.InsertAccountHistoryParams{AccountID: id, At: now,
		Kind: "gate", Reason: "sonnet", Until: now.Add(time.Minute), Evidence: []byte("{}")}); err != nil {
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
