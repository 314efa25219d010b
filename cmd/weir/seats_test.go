package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/controlplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/poolstatus"
	"github.com/weirhq/weir/internal/randid"
)

// TestSeatCommands: weir accounts set --owner gives an OAuth account an
// owner (key:NAME, team:NAME) and takes it away (none), shown by weir
// accounts get and list; an API key account is refused naming the field;
// weir settings set owned_accounts=owners_only, and weir status lists
// each owner's seats.
func TestSeatCommands(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), pgtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin := "admin-" + randid.Hex(12)
	cp, err := controlplane.New(controlplane.Config{AdminToken: admin, DataplaneToken: "dp-" + randid.Hex(12),
		SecretKey: []byte(randid.Hex(16)), DisableJobs: true}, pool)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(cp.Handler())
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetHTTP1(true)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	t.Cleanup(ts.Close)
	// The accounts' upstream: nothing to read there (the profile read at
	// create time finds no profile).
	upstream := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(upstream.Close)

	token := "sk-ant-oat01-" + randid.Hex(20)
	apiKey := "sk-ant-api03-" + randid.Hex(20)
	weir := func(stdin string, args ...string) (string, error) {
		t.Helper()
		e, out, errOut := testEnv(map[string]string{"WEIR_CONTROLPLANE_URL": ts.URL, "WEIR_ADMIN_TOKEN": admin}, stdin)
		err := run(t.Context(), args, e)
		all := out.String() + errOut.String() + errString(err)
		if strings.Contains(all, token) || strings.Contains(all, apiKey) {
			t.Errorf("weir %s printed a credential", strings.Join(args, " "))
		}
		return out.String() + errOut.String(), err
	}
	must := func(stdin string, args ...string) string {
		t.Helper()
		out, err := weir(stdin, args...)
		if err != nil {
			t.Fatalf("weir %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	must(token, "accounts", "add", "--label", "alice-max", "--auth", "oauth", "--secret-stdin", "--base-url", upstream.URL)
	must(apiKey, "accounts", "add", "--label", "api", "--secret-stdin", "--base-url", upstream.URL)
	must("", "keys", "create", "alice")

	out := must("", "accounts", "set", "alice-max", "--owner", "key:alice")
	if !strings.Contains(out, "OWNER") || !strings.Contains(out, "key:alice") {
		t.Errorf("set --owner:\n%s", out)
	}
	if out = must("", "accounts", "get", "alice-max"); !strings.Contains(out, "owner: key:alice\n") {
		t.Errorf("get:\n%s", out)
	}
	out = must("", "accounts", "get", "alice-max", "--json")
	var got struct {
		Owner struct{ Kind, Name string } `json:"owner"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Owner.Kind != "OWNER_KIND_KEY" || got.Owner.Name != "alice" {
		t.Errorf("get --json: %v\n%s", err, out)
	}
	out, err = weir("", "accounts", "set", "api", "--owner", "key:alice")
	if err == nil || !strings.Contains(out+err.Error(), "owner: account \"api\" is an API key; metered keys are not seats") {
		t.Errorf("an API key's owner: %v\n%s", err, out)
	}
	out, err = weir("", "accounts", "set", "alice-max", "--owner", "alice")
	if err == nil || !strings.Contains(out+err.Error(), "want key:NAME, team:NAME or none") {
		t.Errorf("a malformed --owner: %v\n%s", err, out)
	}

	if out = must("", "settings", "set", "owned_accounts=owners_only"); !strings.Contains(out, "owners_only") {
		t.Errorf("settings set:\n%s", out)
	}
	out = must("", "status")
	for _, want := range []string{"Seats (owned_accounts=owners_only: they serve their owners alone)", "key:alice: 1 seat, 1 active: alice-max active"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	out, err = weir("", "settings", "set", "owned_accounts=everyone")
	if err == nil || !strings.Contains(out+err.Error(), "shared or owners_only") {
		t.Errorf("a bad mode: %v\n%s", err, out)
	}

	must("", "accounts", "set", "alice-max", "--owner", "none")
	if out = must("", "accounts", "get", "alice-max"); !strings.Contains(out, "owner: none") {
		t.Errorf("get after --owner none:\n%s", out)
	}
	if out = must("", "status"); strings.Contains(out, "Seats") {
		t.Errorf("status shows seats with none:\n%s", out)
	}
}

// TestStatusSeats: weir status lists each owner's seats; under
// owners_only it warns when an owner's seats are all out while shared
// accounts of the provider can serve, when a provider's shared accounts
// are all out while seats are kept for their owners, and when the owning
// key is revoked; under shared it warns of none of it.
func TestStatusSeats(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	active, cooling := weirv1.AccountState_ACCOUNT_STATE_ACTIVE, weirv1.AccountState_ACCOUNT_STATE_COOLING
	key := func(name string) *weirv1.AccountOwner {
		return &weirv1.AccountOwner{Kind: weirv1.OwnerKind_OWNER_KIND_KEY, Name: name, Id: "id-" + name}
	}
	anthropic, codex := weirv1.Provider_PROVIDER_ANTHROPIC, weirv1.Provider_PROVIDER_CODEX
	accts := []*weirv1.Account{
		{Label: "alice-max", Provider: anthropic, State: cooling, Owner: key("alice")},
		{Label: "alice-pro", Provider: anthropic, State: cooling, Owner: key("alice")},
		{Label: "infra-max", Provider: anthropic, State: active, Owner: &weirv1.AccountOwner{Kind: weirv1.OwnerKind_OWNER_KIND_TEAM, Name: "infra"}},
		{Label: "shared-pro", Provider: anthropic, State: active},
		{Label: "bob-plus", Provider: codex, State: active, Owner: key("bob")},
		{Label: "shared-plus", Provider: codex, State: cooling},
		{Label: "gone-max", Provider: anthropic, State: active, Owner: &weirv1.AccountOwner{Kind: weirv1.OwnerKind_OWNER_KIND_KEY, Name: "gone", Revoked: true}},
	}
	ownersOnly := &weirv1.Settings{OwnedAccounts: weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY}
	st := poolstatus.Build(accts, ownersOnly, nil, now)
	var b strings.Builder
	if err := printStatus(&b, st, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Seats (owned_accounts=owners_only: they serve their owners alone)",
		"  key:alice: 2 seats, 0 active: alice-max cooling, alice-pro cooling",
		"  key:bob: 1 seat, 1 active: bob-plus active",
		"  key:gone (revoked): 1 seat, 1 active: gone-max active",
		"  team:infra: 1 seat, 1 active: infra-max active",
		"key:alice: every seat is out (alice-max cooling, alice-pro cooling); its requests take the shared accounts meanwhile (1 can serve)",
		"codex: none of the 1 shared accounts can serve now, and 1 seat is kept for its owner (owners_only): keys without a seat have nothing left to use",
		"key:gone is revoked: its 1 seat serves no one under owners_only",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "anthropic: ") {
		t.Errorf("anthropic has a shared account serving, yet status says it has none:\n%s", b.String())
	}

	st = poolstatus.Build(accts, &weirv1.Settings{}, nil, now)
	b.Reset()
	if err := printStatus(&b, st, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Seats (owned_accounts=shared: they serve anyone, their owners first)") {
		t.Errorf("shared status lacks its seats:\n%s", b.String())
	}
	for _, p := range st.Problems {
		if p.Kind == "seats" {
			t.Errorf("under shared, a seats problem: %s", p.Detail)
		}
	}
}
