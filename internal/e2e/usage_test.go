package e2e

import (
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The unified rate-limit headers of a real response reach the usage view
// through the worker's Release: an OAuth account has evidence of its
// windows before any poll.
func TestUsageHeadersReachTheView(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "max", oauth: true}}})
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("status = %d: %s", r.status, r.body)
	}
	e.leasesReleased()
	res, err := e.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	a := res.Msg.Accounts[0]
	if len(a.Usage) != 2 {
		t.Fatalf("usage %v, want five_hour and seven_day from the headers", a.Usage)
	}
	for _, w := range a.Usage {
		// The simulator's account is idle: 0 is a reading, not its absence.
		if w.Source != "header" || w.Utilization == nil || *w.Utilization != 0 || !w.ResetsAt.AsTime().After(time.Now()) {
			t.Errorf("window %v", w)
		}
	}
	if a.UsageReadAt != nil {
		t.Error("headers are not a read of the usage endpoint")
	}
}
