package controlplane

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/jobs"
)

// TestIntegrityCredentialsAndReport: a replica holding a different secret
// key reports every credential unreadable (labels only, no secret in any
// log), the right key reports only a corrupted row, and operators read the
// stored report through OpsService with the admin token.
func TestIntegrityCredentialsAndReport(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	api, _ := e.createAccount(acct{label: "api"})
	access, refresh := oauthToken(), refreshToken()
	e.secrets.add(access)
	e.secrets.add(refresh)
	oauth, _ := e.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH,
		credential: oauthJSON(access, refresh, e.clock.Now().Add(time.Hour))})
	e.createAccount(acct{label: "fine"})

	ops := func(token string) weirv1connect.OpsServiceClient {
		hc := rpcclient.HTTPClient()
		t.Cleanup(hc.CloseIdleConnections)
		return weirv1connect.NewOpsServiceClient(hc, e.ts.URL, connect.WithInterceptors(rpcclient.Token(token)))
	}
	admin := ops(e.cfg.AdminToken)

	// No report before the first run.
	resp, err := admin.LastIntegrityReport(ctx, connect.NewRequest(&weirv1.LastIntegrityReportRequest{}))
	if err != nil || resp.Msg.Report != nil {
		t.Fatalf("before any run: %v, %v", resp, err)
	}
	if _, err := ops(e.cfg.DataplaneToken).LastIntegrityReport(ctx, connect.NewRequest(&weirv1.LastIntegrityReportRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("data-plane token: %v, want unauthenticated", err)
	}

	if got, err := e.srv.acct.CheckCredentials(ctx); err != nil || len(got) != 0 {
		t.Fatalf("right key: unreadable %v, %v; want none", got, err)
	}

	// Another deployment's key opens nothing.
	cfg := e.cfg
	cfg.SecretKey = randid.Bytes(32)
	cfg.Registry, cfg.Logger = nil, nil
	other := newEnv(t, e.pool, cfg, e.clock)
	other.secrets = e.secrets
	got, err := other.srv.acct.CheckCredentials(ctx)
	if err != nil || !slices.Equal(got, []string{"api", "fine", "max"}) {
		t.Fatalf("other key: unreadable %v, %v; want every label", got, err)
	}

	// With the right key, a corrupted access token or refresh token.
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET credential_sealed = '\x01deadbeef' WHERE id = $1`, api.Id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET refresh_sealed = overlay(refresh_sealed placing '\x00' from 20 for 1) WHERE id = $1`, oauth.Id); err != nil {
		t.Fatal(err)
	}
	got, err = e.srv.acct.CheckCredentials(ctx)
	if err != nil || !slices.Equal(got, []string{"api", "max"}) {
		t.Fatalf("corrupted rows: unreadable %v, %v; want api and max", got, err)
	}

	// The job over the other replica's key: the report names all three,
	// the metrics count them.
	if _, err := jobs.RunIntegrityCheck(ctx, jobs.Deps{
		Queries: e.q, Logger: other.srv.log, Now: e.clock.Now, LeaseGrace: 10 * time.Minute,
		Creds: other.srv.acct, Findings: other.srv.integ.count,
	}); err != nil {
		t.Fatalf("integrity check: %v", err)
	}
	resp, err = admin.LastIntegrityReport(ctx, connect.NewRequest(&weirv1.LastIntegrityReportRequest{}))
	if err != nil || resp.Msg.Report == nil {
		t.Fatalf("after a run: %v, %v", resp, err)
	}
	rep := resp.Msg.Report
	if !rep.RanAt.AsTime().Equal(e.clock.Now()) {
		t.Errorf("ran_at %v, want %v", rep.RanAt.AsTime(), e.clock.Now())
	}
	var found *weirv1.IntegrityFinding
	for _, f := range rep.Findings {
		if f.Kind == jobs.FindingUnreadableCredential {
			found = f
		}
	}
	if found == nil || found.Count != 3 || found.Action != "reported" || len(found.Accounts) != 3 || found.Accounts[0].Label != "api" {
		t.Fatalf("unreadable finding %v", found)
	}
	if len(rep.Findings) != 8 {
		t.Errorf("%d findings, want one per kind (8)", len(rep.Findings))
	}

	hr, err := http.Get(other.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hr.Body)
	hr.Body.Close()
	if want := `weir_controlplane_integrity_findings_total{action="reported",kind="unreadable_credential"} 3`; !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %q", want)
	}
	if logs := other.logs.String(); !strings.Contains(logs, "kind=unreadable_credential action=reported count=3") {
		t.Errorf("no finding line in the log:\n%s", logs)
	}
}
