package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// fakeOps serves OpsService with a report a test sets, behind a token.
type fakeOps struct {
	weirv1connect.UnimplementedOpsServiceHandler
	token string
	mu    sync.Mutex
	rep   *weirv1.IntegrityReport
}

func (f *fakeOps) LastIntegrityReport(_ context.Context, req *connect.Request[weirv1.LastIntegrityReportRequest]) (*connect.Response[weirv1.LastIntegrityReportResponse], error) {
	if req.Header().Get("Authorization") != "Bearer "+f.token {
		return nil, connect.NewError(connect.CodeUnauthenticated, nil)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&weirv1.LastIntegrityReportResponse{Report: f.rep}), nil
}

// TestIntegrityCommand: `weir integrity` prints the last report (or says
// there is none yet), as a table or JSON, against the control plane's
// OpsService.
func TestIntegrityCommand(t *testing.T) {
	t.Parallel()
	ops := &fakeOps{token: "admin-secret"}
	_, h := weirv1connect.NewOpsServiceHandler(ops)
	ts := httptest.NewUnstartedServer(h)
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetHTTP1(true)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	t.Cleanup(ts.Close)

	integrity := func(token string, args ...string) (string, error) {
		e, out, errOut := testEnv(map[string]string{
			"WEIR_CONTROLPLANE_URL": ts.URL, "WEIR_ADMIN_TOKEN": token, "WEIR_DATA_DIR": t.TempDir(),
		}, "")
		err := run(t.Context(), append([]string{"integrity"}, args...), e)
		return out.String() + errOut.String(), err
	}

	if out, err := integrity("admin-secret"); err != nil || !strings.Contains(out, "no integrity report yet") {
		t.Fatalf("before any run: %v: %s", err, out)
	}

	ranAt := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	ops.mu.Lock()
	ops.rep = &weirv1.IntegrityReport{RanAt: timestamppb.New(ranAt), Findings: []*weirv1.IntegrityFinding{
		{Kind: "cooldown_without_evidence", Action: "repaired", Count: 2},
		{Kind: "stale_lease", Action: "repaired"},
		{Kind: "broken_account", Action: "reported", Count: 1, Accounts: []*weirv1.IntegrityAccount{{Label: "max-1", Reason: "refresh token rejected"}}},
		{Kind: "unreadable_credential", Action: "reported", Count: 1, Accounts: []*weirv1.IntegrityAccount{{Label: "max-2"}}},
	}}
	ops.mu.Unlock()

	out, err := integrity("admin-secret")
	if err != nil {
		t.Fatalf("integrity: %v: %s", err, out)
	}
	for _, want := range []string{
		"integrity check ran 2h0m0s ago (" + ranAt.UTC().Format(time.RFC3339) + ")",
		"KIND", "cooldown_without_evidence  repaired  2",
		"stale_lease                repaired  0      -",
		"broken_account             reported  1      max-1 (refresh token rejected)",
		"unreadable_credential      reported  1      max-2\n",
		"2 finding(s) need an operator",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	out, err = integrity("admin-secret", "--json")
	if err != nil {
		t.Fatalf("integrity --json: %v: %s", err, out)
	}
	var got struct {
		Report struct {
			Findings []struct {
				Kind, Action string
				Count        string
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Report.Findings) != 4 || got.Report.Findings[0].Count != "2" {
		t.Fatalf("integrity --json: %v: %s", err, out)
	}

	if _, err := integrity("wrong"); err == nil || !strings.Contains(err.Error(), "admin token") {
		t.Fatalf("wrong token: %v, want the admin-token hint", err)
	}
	if _, err := integrity("admin-secret", "extra"); err == nil || !strings.Contains(err.Error(), "unexpected argument") {
		t.Fatalf("extra argument: %v", err)
	}
}
