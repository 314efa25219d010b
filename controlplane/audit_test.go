package controlplane

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
)

// adminAPI is every admin service's client, with one token and actor.
type adminAPI struct {
	accounts  weirv1connect.AccountServiceClient
	keys      weirv1connect.KeyServiceClient
	settings  weirv1connect.SettingsServiceClient
	aliases   weirv1connect.AliasServiceClient
	dashboard weirv1connect.DashboardServiceClient
	audit     weirv1connect.AuditServiceClient
}

func (e *env) adminAPI(token, actor string) adminAPI {
	e.t.Helper()
	hc := rpcclient.HTTPClient()
	e.t.Cleanup(hc.CloseIdleConnections)
	opt := connect.WithInterceptors(rpcclient.Token(token), rpcclient.Actor(actor))
	return adminAPI{
		accounts:  weirv1connect.NewAccountServiceClient(hc, e.ts.URL, opt),
		keys:      weirv1connect.NewKeyServiceClient(hc, e.ts.URL, opt),
		settings:  weirv1connect.NewSettingsServiceClient(hc, e.ts.URL, opt),
		aliases:   weirv1connect.NewAliasServiceClient(hc, e.ts.URL, opt),
		dashboard: weirv1connect.NewDashboardServiceClient(hc, e.ts.URL, opt),
		audit:     weirv1connect.NewAuditServiceClient(hc, e.ts.URL, opt),
	}
}

// auditRows reads the audit log, oldest first, through ListAuditEvents.
func (e *env) auditRows(api adminAPI, req *weirv1.ListAuditEventsRequest) []*weirv1.AuditEvent {
	e.t.Helper()
	resp, err := api.audit.ListAuditEvents(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("ListAuditEvents: %v", err)
	}
	ev := resp.Msg.Events
	for i, j := 0, len(ev)-1; i < j; i, j = i+1, j-1 {
		ev[i], ev[j] = ev[j], ev[i]
	}
	return ev
}

// TestAuditRecordsEachAdminChange makes every kind of admin change once,
// with read-only calls between them, and a refused one: the log holds one
// row per change, in order, with the declared actor, the credential, the
// target and the outcome; reads add nothing; a wrong token adds nothing
// and is counted.
func TestAuditRecordsEachAdminChange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	api := e.adminAPI(e.cfg.AdminToken, "alice@laptop")
	reads := func() {
		t.Helper()
		if _, err := api.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{})); err != nil {
			t.Fatal(err)
		}
		if _, err := api.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{})); err != nil {
			t.Fatal(err)
		}
		if _, err := api.settings.GetSettings(ctx, connect.NewRequest(&weirv1.GetSettingsRequest{})); err != nil {
			t.Fatal(err)
		}
		if _, err := api.aliases.ListAliases(ctx, connect.NewRequest(&weirv1.ListAliasesRequest{})); err != nil {
			t.Fatal(err)
		}
		if _, err := api.audit.ListAuditEvents(ctx, connect.NewRequest(&weirv1.ListAuditEventsRequest{})); err != nil {
			t.Fatal(err)
		}
	}
	reads()

	cred := apiKey()
	e.secrets.add(cred)
	created, err := api.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
		Label: "team-a", Credential: cred, MaxConcurrency: 2,
	}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.Account.Id
	if _, err := api.accounts.GetAccount(ctx, connect.NewRequest(&weirv1.GetAccountRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	// Refused: the same upstream account twice, and a label that is empty.
	_, err = api.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
		Label: "team-a-again", Credential: cred,
	}))
	wantCode(t, err, connect.CodeAlreadyExists)
	_, err = api.accounts.PauseAccount(ctx, connect.NewRequest(&weirv1.PauseAccountRequest{Id: "no-such-account"}))
	wantCode(t, err, connect.CodeNotFound)
	steps := []func() error{
		func() error {
			_, err := api.accounts.PauseAccount(ctx, connect.NewRequest(&weirv1.PauseAccountRequest{Id: id}))
			return err
		},
		func() error {
			_, err := api.accounts.ResumeAccount(ctx, connect.NewRequest(&weirv1.ResumeAccountRequest{Id: "team-a"}))
			return err
		},
		func() error {
			_, err := api.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{
				Id: id, UpdateMask: fieldMaskOf("priority"), Priority: 3,
			}))
			return err
		},
		func() error {
			_, err := api.dashboard.ClearCooldown(ctx, connect.NewRequest(&weirv1.ClearCooldownRequest{Id: id}))
			return err
		},
		func() error {
			_, err := api.settings.UpdateSettings(ctx, connect.NewRequest(&weirv1.UpdateSettingsRequest{
				Settings: &weirv1.Settings{CapacityHold: durationpb.New(90 * time.Second)}, UpdateMask: fieldMaskOf("capacity_hold"),
			}))
			return err
		},
		func() error {
			_, err := api.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: "fast", Targets: []string{"claude-haiku-4-5"}}))
			return err
		},
		func() error {
			_, err := api.aliases.DeleteAlias(ctx, connect.NewRequest(&weirv1.DeleteAliasRequest{Alias: "fast"}))
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		reads()
	}
	key, err := api.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "ci"}))
	if err != nil {
		t.Fatal(err)
	}
	e.secrets.add(key.Msg.Secret)
	if _, err := api.keys.RevokeKey(ctx, connect.NewRequest(&weirv1.RevokeKeyRequest{Id: key.Msg.Key.Id})); err != nil {
		t.Fatal(err)
	}
	if _, err := api.accounts.DeleteAccount(ctx, connect.NewRequest(&weirv1.DeleteAccountRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	// Unauthenticated: not in the log, counted.
	intruder := e.adminAPI("Bearer-nothing", "mallory")
	_, err = intruder.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "backdoor"}))
	wantCode(t, err, connect.CodeUnauthenticated)
	_, err = e.adminAPI(e.cfg.DataplaneToken, "worker").accounts.DeleteAccount(ctx, connect.NewRequest(&weirv1.DeleteAccountRequest{Id: id}))
	wantCode(t, err, connect.CodeUnauthenticated)
	if got := counterValue(t, e.srv.metrics.unauthenticated.WithLabelValues(weirv1connect.KeyServiceName)); got != 1 {
		t.Errorf("unauthenticated KeyService calls counted: %v, want 1", got)
	}
	if got := counterValue(t, e.srv.metrics.unauthenticated.WithLabelValues(weirv1connect.AccountServiceName)); got != 1 {
		t.Errorf("unauthenticated AccountService calls counted: %v, want 1", got)
	}

	want := []struct{ procedure, target, outcome string }{
		{weirv1connect.AccountServiceCreateAccountProcedure, id + " (team-a)", "ok"},
		{weirv1connect.AccountServiceCreateAccountProcedure, "team-a-again", "already_exists"},
		{weirv1connect.AccountServicePauseAccountProcedure, "no-such-account", "not_found"},
		{weirv1connect.AccountServicePauseAccountProcedure, id + " (team-a)", "ok"},
		{weirv1connect.AccountServiceResumeAccountProcedure, "team-a", "ok"},
		{weirv1connect.AccountServiceUpdateAccountProcedure, id + " (team-a)", "ok"},
		{weirv1connect.DashboardServiceClearCooldownProcedure, id + " (team-a)", "ok"},
		{weirv1connect.SettingsServiceUpdateSettingsProcedure, "", "ok"},
		{weirv1connect.AliasServiceSetAliasProcedure, "fast", "ok"},
		{weirv1connect.AliasServiceDeleteAliasProcedure, "fast", "ok"},
		{weirv1connect.KeyServiceCreateKeyProcedure, key.Msg.Key.Id + " (ci)", "ok"},
		{weirv1connect.KeyServiceRevokeKeyProcedure, key.Msg.Key.Id + " (ci)", "ok"},
		{weirv1connect.AccountServiceDeleteAccountProcedure, id, "ok"},
	}
	got := e.auditRows(api, &weirv1.ListAuditEventsRequest{PageSize: 100})
	if len(got) != len(want) {
		for _, g := range got {
			t.Logf("%s %s %s", g.Procedure, g.Target, g.Outcome)
		}
		t.Fatalf("%d audit rows, want %d (one per change, none per read or unauthenticated call)", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Procedure != w.procedure || g.Target != w.target || g.Outcome != w.outcome {
			t.Errorf("row %d: %s %q %s, want %s %q %s", i, g.Procedure, g.Target, g.Outcome, w.procedure, w.target, w.outcome)
		}
		if g.Actor != "alice@laptop" || g.Credential != "admin_token" || g.Peer == "" || !g.At.AsTime().Equal(epoch) {
			t.Errorf("row %d: actor %q credential %q peer %q at %v", i, g.Actor, g.Credential, g.Peer, g.At.AsTime())
		}
	}
	// The summary keeps what the change was, and only that.
	var sum struct {
		Fields   map[string]any `json:"fields"`
		Redacted []string       `json:"redacted"`
	}
	if err := json.Unmarshal([]byte(got[0].Summary), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Fields["label"] != "team-a" || sum.Fields["max_concurrency"] != float64(2) || strings.Join(sum.Redacted, ",") != "credential" {
		t.Errorf("CreateAccount summary: %s", got[0].Summary)
	}
	if !strings.Contains(got[7].Summary, `"capacity_hold": "90s"`) {
		t.Errorf("UpdateSettings summary: %s", got[7].Summary)
	}
}

// TestAuditKeepsNoSecret creates API-key and OAuth accounts, rotates a
// credential, creates keys (also refused ones carrying a credential) and
// scans every audit row, whole, and the ListAuditEvents answer for every
// secret.
func TestAuditKeepsNoSecret(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	api := e.adminAPI(e.cfg.AdminToken, "ops")
	var secrets []string
	create := func(label string, kind weirv1.AuthKind, cred string) (*weirv1.Account, error) {
		secrets = append(secrets, cred)
		e.secrets.add(cred)
		resp, err := api.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: kind, Label: label, Credential: cred, BaseUrl: e.ts.URL,
		}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Account, nil
	}
	apiAcct, err := create("api", weirv1.AuthKind_AUTH_KIND_API_KEY, apiKey())
	if err != nil {
		t.Fatal(err)
	}
	access, refresh := oauthToken(), "sk-ant-ort01-"+randid.Hex(40)
	secrets = append(secrets, access)
	if _, err := create("oauth", weirv1.AuthKind_AUTH_KIND_OAUTH, oauthJSON(access, refresh, epoch.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	secrets = append(secrets, refresh)
	// Refused, with the secret in the request all the same.
	if _, err := create("", weirv1.AuthKind_AUTH_KIND_API_KEY, apiKey()); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("CreateAccount without a label: %v, want invalid_argument", err)
	}
	rotated := apiKey()
	secrets = append(secrets, rotated)
	e.secrets.add(rotated)
	if _, err := api.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: apiAcct.Id, UpdateMask: fieldMaskOf("credential"), Credential: rotated,
	})); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"k1", "k2"} {
		k, err := api.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, k.Msg.Secret, HashKey(k.Msg.Secret))
		e.secrets.add(k.Msg.Secret)
	}

	var rows []string
	r, err := e.pool.Query(ctx, `SELECT row_to_json(a)::text FROM audit_events a`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		if err := r.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("%d audit rows, want 6", len(rows))
	}
	listed, err := api.audit.ListAuditEvents(ctx, connect.NewRequest(&weirv1.ListAuditEventsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	// A failure prints the row with every secret masked, never one.
	masked := func(row string) string {
		for _, s := range secrets {
			row = strings.ReplaceAll(row, s, "<SECRET>")
		}
		return row
	}
	for _, s := range secrets {
		for _, row := range rows {
			if strings.Contains(row, s) {
				t.Errorf("an audit row holds a secret (%d characters): %s", len(s), masked(row))
			}
		}
		requireAbsent(t, "ListAuditEvents", listed.Msg, s)
	}
	// What a rotation was is still there: the field's name.
	if !strings.Contains(strings.Join(rows, "\n"), `"redacted": ["credential"]`) {
		t.Errorf("no row records that a credential was sent:\n%s", strings.Join(rows, "\n"))
	}
}

// TestAuditFields: every admin procedure that can change something has a
// reviewed allowlist naming only real, non-secret fields, and is unary
// (the interceptor records unary calls). A new RPC fails here until
// someone decides what its audit row keeps.
func TestAuditFields(t *testing.T) {
	t.Parallel()
	seen := map[protoreflect.FullName]bool{}
	protoregistry.GlobalFiles.RangeFilesByPackage("weir.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				spec := connect.Spec{Procedure: "/" + string(svc.FullName()) + "/" + string(m.Name()), IdempotencyLevel: idempotency(m)}
				if !audited(spec) {
					continue
				}
				if m.IsStreamingClient() || m.IsStreamingServer() {
					t.Errorf("%s streams: the audit interceptor does not record it", spec.Procedure)
				}
				in := m.Input()
				seen[in.FullName()] = true
				fields, ok := auditFields[in.FullName()]
				if !ok {
					t.Errorf("%s: no auditFields entry for %s", spec.Procedure, in.FullName())
				}
				for _, n := range fields {
					if in.Fields().ByName(n) == nil {
						t.Errorf("auditFields[%s] names %q, not a field", in.FullName(), n)
					}
					for _, bad := range []string{"credential", "secret", "token", "password"} {
						if strings.Contains(string(n), bad) {
							t.Errorf("auditFields[%s] keeps %q, which may carry secret material", in.FullName(), n)
						}
					}
				}
			}
		}
		return true
	})
	for name := range auditFields {
		if !seen[name] {
			t.Errorf("auditFields lists %s, the input of no audited procedure", name)
		}
	}
	if len(seen) < 13 {
		t.Errorf("only %d audited procedures found; the descriptors were not read", len(seen))
	}
}

// TestListAuditEventsPagesAndFilters: newest first, pages that neither
// skip nor repeat, and the actor, procedure and time filters.
func TestListAuditEventsPagesAndFilters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	alice, bob := e.adminAPI(e.cfg.AdminToken, "alice"), e.adminAPI(e.cfg.AdminToken, "bob")
	for i := range 5 {
		api := alice
		if i%2 == 1 {
			api = bob
		}
		if _, err := api.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: "a" + string(rune('0'+i)), Targets: []string{"claude-haiku-4-5"}})); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Minute)
	}
	if _, err := bob.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "k"})); err != nil {
		t.Fatal(err)
	}
	var all []string
	tok := ""
	for pages := 0; ; pages++ {
		resp, err := alice.audit.ListAuditEvents(ctx, connect.NewRequest(&weirv1.ListAuditEventsRequest{PageSize: 4, PageToken: tok}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Msg.Events {
			all = append(all, ev.Target)
		}
		if tok = resp.Msg.NextPageToken; tok == "" {
			if pages != 1 {
				t.Errorf("%d pages of 4 for 6 events, want 2", pages+1)
			}
			break
		}
	}
	if got := strings.Join(all, ","); !strings.HasSuffix(got, ",a4,a3,a2,a1,a0") || len(all) != 6 {
		t.Errorf("paged, newest first: %s", got)
	}
	count := func(req *weirv1.ListAuditEventsRequest) int {
		t.Helper()
		return len(e.auditRows(alice, req))
	}
	if n := count(&weirv1.ListAuditEventsRequest{Actor: "bob"}); n != 3 {
		t.Errorf("actor bob: %d, want 3", n)
	}
	if n := count(&weirv1.ListAuditEventsRequest{Procedure: "SetAlias"}); n != 5 {
		t.Errorf("procedure SetAlias: %d, want 5", n)
	}
	if n := count(&weirv1.ListAuditEventsRequest{Procedure: weirv1connect.KeyServiceCreateKeyProcedure}); n != 1 {
		t.Errorf("procedure by full name: %d, want 1", n)
	}
	if n := count(&weirv1.ListAuditEventsRequest{Since: timestamppb.New(epoch.Add(2 * time.Minute)), Until: timestamppb.New(epoch.Add(4 * time.Minute))}); n != 2 {
		t.Errorf("since/until: %d, want 2", n)
	}
	// Targets: the calls that named an account, by its id or its label,
	// whichever the call was given; another account's are not among them.
	var ids []string
	for _, label := range []string{"acct-x", "acct-x2"} {
		cred := apiKey()
		e.secrets.add(cred)
		created, err := bob.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: label, Credential: cred}))
		if err != nil {
			t.Fatal(err)
		}
		id := created.Msg.Account.Id
		ids = append(ids, id)
		if _, err := bob.accounts.PauseAccount(ctx, connect.NewRequest(&weirv1.PauseAccountRequest{Id: id})); err != nil {
			t.Fatal(err)
		}
		if _, err := bob.accounts.ResumeAccount(ctx, connect.NewRequest(&weirv1.ResumeAccountRequest{Id: label})); err != nil {
			t.Fatal(err)
		}
	}
	byTargets := func(targets ...string) []string {
		var out []string
		for _, ev := range e.auditRows(alice, &weirv1.ListAuditEventsRequest{Targets: targets}) {
			out = append(out, ev.Procedure+" "+ev.Target)
		}
		return out
	}
	if got := byTargets(ids[0], "acct-x"); len(got) != 3 || strings.Contains(strings.Join(got, ","), ids[1]) {
		t.Errorf("acct-x by id and label: %q, want its create, pause and resume only", got)
	}
	// Resumed by its label, the call's target is the label alone.
	if got := byTargets(ids[0]); len(got) != 2 {
		t.Errorf("acct-x by id: %q, want its create and pause", got)
	}
	if got := byTargets("acct-x2"); len(got) != 3 || strings.Contains(strings.Join(got, ","), ids[0]) {
		t.Errorf("acct-x2 by label: %q, want 3 of its own", got)
	}
	if got := byTargets("acct"); len(got) != 0 {
		t.Errorf("a prefix of a label: %q, want none", got)
	}
	_, err := alice.audit.ListAuditEvents(ctx, connect.NewRequest(&weirv1.ListAuditEventsRequest{PageToken: "nope"}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

// TestAuditDashboardActions: a change made in the dashboard is recorded
// with the session as actor and the browser's address as peer; its page
// views are not recorded.
func TestAuditDashboardActions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "dash"})
	b := e.browser()
	b.login(e.cfg.AdminToken)
	csrf := b.csrf()
	wantStatus(t, "pause", b.post("/dashboard/accounts/"+a.Id+"/pause", url.Values{"csrf": {csrf}}), 303)
	b.get("/dashboard/settings")
	rows := e.auditRows(e.adminAPI(e.cfg.AdminToken, "test"), &weirv1.ListAuditEventsRequest{})
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2 (the create, the pause)", len(rows))
	}
	p := rows[1]
	if p.Procedure != weirv1connect.AccountServicePauseAccountProcedure || p.Target != a.Id+" (dash)" || p.Outcome != "ok" {
		t.Errorf("dashboard pause: %s %q %s", p.Procedure, p.Target, p.Outcome)
	}
	if !strings.HasPrefix(p.Actor, "dashboard (session ") || p.Credential != "admin_token" || !strings.HasPrefix(p.Peer, "127.0.0.1:") {
		t.Errorf("dashboard pause: actor %q credential %q peer %q", p.Actor, p.Credential, p.Peer)
	}
	// The audit page shows it, filtered by its actor; reading it is no
	// change.
	page := b.get("/dashboard/audit?actor=" + url.QueryEscape(p.Actor))
	wantStatus(t, "audit page", page, 200)
	if !strings.Contains(page.body, "/weir.v1.AccountService/PauseAccount") || strings.Contains(page.body, "CreateAccount") {
		t.Errorf("audit page filtered by the session's actor:\n%s", page.body)
	}
	if n := e.count(`SELECT count(*) FROM audit_events`); n != 2 {
		t.Errorf("%d audit rows after viewing the audit page, want 2", n)
	}
}

// idempotency is a method's idempotency_level as connect-go spells it
// (the two enums share their numbers).
func idempotency(m protoreflect.MethodDescriptor) connect.IdempotencyLevel {
	opts, _ := m.Options().(*descriptorpb.MethodOptions)
	return connect.IdempotencyLevel(opts.GetIdempotencyLevel())
}

func fieldMaskOf(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }
