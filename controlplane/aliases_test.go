package controlplane

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
)

func (e *env) aliasClient(token string) weirv1connect.AliasServiceClient {
	hc := rpcclient.HTTPClient()
	e.t.Cleanup(hc.CloseIdleConnections)
	return weirv1connect.NewAliasServiceClient(hc, e.ts.URL, connect.WithInterceptors(rpcclient.Token(token)))
}

func TestAliasService(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ac := e.aliasClient(e.cfg.AdminToken)
	ctx := t.Context()
	set := func(alias string, targets ...string) error {
		_, err := ac.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: alias, Targets: targets}))
		return err
	}
	for _, bad := range []struct {
		alias   string
		targets []string
	}{
		{"", []string{opusModel}},
		{"best", nil},
		{"best", []string{"has space"}},
		{"best", []string{"best"}},
		{"best", []string{opusModel, opusModel}},
	} {
		if err := set(bad.alias, bad.targets...); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("SetAlias(%q, %q) = %v, want invalid argument", bad.alias, bad.targets, err)
		}
	}
	if err := set("best", opusModel, sonnetModel); err != nil {
		t.Fatal(err)
	}
	if err := set("best", sonnetModel); err != nil { // replaces
		t.Fatal(err)
	}
	if err := set("any", opusModel); err != nil {
		t.Fatal(err)
	}
	list, err := ac.ListAliases(ctx, connect.NewRequest(&weirv1.ListAliasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := list.Msg.Aliases; len(got) != 2 || got[0].Alias != "any" || got[1].Alias != "best" || len(got[1].Targets) != 1 || got[1].Targets[0] != sonnetModel {
		t.Fatalf("aliases %v", got)
	}
	if _, err := ac.DeleteAlias(ctx, connect.NewRequest(&weirv1.DeleteAliasRequest{Alias: "any"})); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.DeleteAlias(ctx, connect.NewRequest(&weirv1.DeleteAliasRequest{Alias: "any"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("second delete: %v, want not found", err)
	}
	// The data-plane token does not open it.
	if _, err := e.aliasClient(e.cfg.DataplaneToken).ListAliases(ctx, connect.NewRequest(&weirv1.ListAliasesRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated && connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("ListAliases with the data-plane token: %v", err)
	}
}

// Acquire resolves an alias to its first target with an eligible account,
// advances past a target whose family is gated, and never changes a
// concrete model.
func TestAcquireAlias(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "a"})
	_, keyHash := e.createKey("")
	ac := e.aliasClient(e.cfg.AdminToken)
	if _, err := ac.SetAlias(t.Context(), connect.NewRequest(&weirv1.SetAliasRequest{Alias: "best", Targets: []string{opusModel, sonnetModel}})); err != nil {
		t.Fatal(err)
	}
	lease := func(model string) *weirv1.Lease {
		t.Helper()
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: model})
		if _, err := e.dp.leases.Release(t.Context(), connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: l.Id, Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}})); err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := lease("best"); l.Model != opusModel {
		t.Errorf("alias resolved to %q, want the first target %q", l.Model, opusModel)
	}
	if l := lease(opusModel); l.Model != "" {
		t.Errorf("a concrete model came back as %q: it never changes", l.Model)
	}
	// Gate opus on the only account: the alias advances to sonnet.
	if _, err := e.q.WriteFamilyGate(t.Context(), db.WriteFamilyGateParams{
		AccountID: uuid.MustParse(a.Id), Family: "opus", Until: e.clock.Now().Add(time.Hour), Now: e.clock.Now(), Evidence: []byte(`{"class":"rate_limited"}`),
	}); err != nil {
		t.Fatal(err)
	}
	if l := lease("best"); l.Model != sonnetModel {
		t.Errorf("alias resolved to %q with opus gated, want %q", l.Model, sonnetModel)
	}
	// The concrete gated model does not advance.
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	// Cooling the account: no target has an eligible account.
	if _, err := e.q.WriteCooldown(t.Context(), db.WriteCooldownParams{
		AccountID: uuid.MustParse(a.Id), Reason: "rate_limited", Transient: true, Until: e.clock.Now().Add(time.Minute), Now: e.clock.Now(), Evidence: []byte(`{"class":"rate_limited"}`),
	}); err != nil {
		t.Fatal(err)
	}
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "best"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.Permanent || none.RetryAt == nil {
		t.Errorf("no account for the alias: %v", none)
	}
}
