package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/proxytest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/syncbuf"
)

// pinnedKey is a client key that may use label's account only.
func (e *env) pinnedKey(label string) string {
	e.t.Helper()
	res, err := e.keys.CreateKey(e.t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{
		Name: "pinned-" + label + "-" + randid.Hex(4), PinnedAccounts: []string{e.ids[label]}}))
	if err != nil {
		e.t.Fatalf("create a key pinned to %s: %v", label, err)
	}
	return res.Msg.Secret
}

// postAs sends a Messages request with key.
func (e *env) postAs(key string, stream bool) response {
	e.t.Helper()
	return e.do(http.MethodPost, "/v1/messages", messagesBody(stream), func(r *http.Request) { r.Header.Set("X-Api-Key", key) })
}

// via says, for each upstream exchange from index from on, which account
// sent it and through which of proxies it came ("" direct): label →
// the proxies' names, one per exchange.
func (e *env) via(from int, proxies map[string]*proxytest.Proxy) map[string][]string {
	e.t.Helper()
	byCred := map[string]string{}
	for label, c := range e.creds {
		byCred[c] = label
	}
	out := map[string][]string{}
	for _, x := range e.upstream.exchanges()[from:] {
		cred := x.reqHeader.Get("X-Api-Key")
		if cred == "" {
			cred = strings.TrimPrefix(x.reqHeader.Get("Authorization"), "Bearer ")
		}
		through := ""
		for name, p := range proxies {
			if p.Opened(x.remote) {
				through = name
			}
		}
		label := byCred[cred]
		if label == "" {
			label = "(" + x.path + ")" // a token or usage call: no credential of a request
		}
		out[label] = append(out[label], through)
	}
	return out
}

// TestEgressProxyCarriesInference: an account with a SOCKS5 proxy (user
// and password) and one with an HTTP proxy (forwarding the simulator's
// plain http://, with Basic credentials) reach the upstream only through
// their proxy, streamed or not; an account without one goes direct. The
// accounts show their proxy by host.
func TestEgressProxyCarriesInference(t *testing.T) {
	t.Parallel()
	socks := proxytest.NewSOCKS5(t, "agent", "socks-"+randid.Hex(8))
	hp := proxytest.NewHTTP(t, "agent", "http-"+randid.Hex(8))
	e := setup(t, options{accounts: []account{
		{label: "via-socks", proxy: socks.URL}, {label: "via-http", proxy: hp.URL}, {label: "direct"},
	}})
	for _, label := range []string{"via-socks", "via-http", "direct"} {
		key := e.pinnedKey(label)
		for _, stream := range []bool{false, true} {
			if r := e.postAs(key, stream); r.status != http.StatusOK {
				t.Fatalf("%s (stream %v): status %d: %s", label, stream, r.status, r.body)
			}
		}
	}
	got := e.via(0, map[string]*proxytest.Proxy{"socks": socks, "http": hp})
	for label, want := range map[string]string{"via-socks": "socks", "via-http": "http", "direct": ""} {
		if g := got[label]; len(g) != 2 || g[0] != want || g[1] != want {
			t.Errorf("%s's requests came through %q, want both through %q", label, g, want)
		}
	}
	if socks.Count() < 1 {
		t.Errorf("the SOCKS5 proxy opened no tunnel")
	}
	// The HTTP proxy forwards each request itself: both are in its log.
	wantHTTP := "POST " + e.simSrv.URL + "/v1/messages"
	if p := hp.Passed(); len(p) != 2 || p[0] != wantHTTP || p[1] != wantHTTP {
		t.Errorf("the HTTP proxy passed %q, want two %q", p, wantHTTP)
	}
	for label, want := range map[string]string{"via-socks": "socks5://" + socks.Addr, "via-http": "http://" + hp.Addr, "direct": ""} {
		a := e.account(label)
		if a.EgressProxy != want || a.EgressVia != want {
			t.Errorf("%s: egress_proxy %q, egress_via %q; want %q", label, a.EgressProxy, a.EgressVia, want)
		}
	}
}

// TestEgressDefaultProxy: the default proxy (the egress_proxy setting)
// carries every account that names none of its own, from the moment it is
// set (the worker's reused leases go); an account set to direct bypasses
// it, and one with its own keeps its own.
func TestEgressDefaultProxy(t *testing.T) {
	t.Parallel()
	def := proxytest.NewSOCKS5(t, "", "")
	own := proxytest.NewSOCKS5(t, "", "")
	proxies := map[string]*proxytest.Proxy{"default": def, "own": own}
	e := setup(t, options{accounts: []account{
		{label: "follows"}, {label: "bypass", proxy: "direct"}, {label: "own", proxy: own.URL},
	}})
	keys := map[string]string{}
	for _, l := range []string{"follows", "bypass", "own"} {
		keys[l] = e.pinnedKey(l)
	}
	// No default yet: follows goes direct.
	if r := e.postAs(keys["follows"], false); r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := e.via(0, proxies)["follows"]; !slices.Equal(got, []string{""}) {
		t.Errorf("before the default, follows came through %q, want direct", got)
	}
	e.change(func() {
		res, err := e.settings.UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
			Settings: &weirv1.Settings{EgressProxy: def.URL}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
		if err != nil {
			t.Fatalf("set the default proxy: %v", err)
		}
		if res.Msg.Settings.EgressProxy != "socks5://"+def.Addr {
			t.Errorf("settings show egress_proxy %q", res.Msg.Settings.EgressProxy)
		}
	})
	from := len(e.upstream.exchanges())
	for _, l := range []string{"follows", "bypass", "own"} {
		if r := e.postAs(keys[l], false); r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", l, r.status, r.body)
		}
	}
	got := e.via(from, proxies)
	for label, want := range map[string]string{"follows": "default", "bypass": "", "own": "own"} {
		if !slices.Equal(got[label], []string{want}) {
			t.Errorf("%s came through %q, want %q", label, got[label], want)
		}
	}
	for label, want := range map[string][2]string{
		"follows": {"", "socks5://" + def.Addr}, "bypass": {"direct", ""}, "own": {"socks5://" + own.Addr, "socks5://" + own.Addr},
	} {
		if a := e.account(label); a.EgressProxy != want[0] || a.EgressVia != want[1] {
			t.Errorf("%s: egress_proxy %q, egress_via %q; want %q", label, a.EgressProxy, a.EgressVia, want)
		}
	}
}

// TestEgressProxyForAccountCalls: the control plane's own calls for an
// OAuth account go through its proxy too: the profile read when it is
// added, a usage read and a token refresh. The HTTP proxy sees each.
func TestEgressProxyForAccountCalls(t *testing.T) {
	t.Parallel()
	hp := proxytest.NewHTTP(t, "cp", "pw-"+randid.Hex(8))
	e := setup(t, options{accounts: []account{{label: "max", oauth: true, refreshable: true, proxy: hp.URL}}})
	res, err := e.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: "max"}))
	if err != nil || !res.Msg.Read || res.Msg.Error != "" {
		t.Fatalf("usage read: %v %v", res, err)
	}
	n, err := e.cp.AccountJobs().RefreshDue(t.Context())
	if err != nil || n != 1 || e.sim.TokenRefreshes("max") != 1 {
		t.Fatalf("refreshed %d (the simulator saw %d): %v", n, e.sim.TokenRefreshes("max"), err)
	}
	base := e.simSrv.URL
	want := []string{"GET " + base + "/api/oauth/profile", "GET " + base + "/api/oauth/usage", "POST " + base + "/v1/oauth/token"}
	if got := hp.Passed(); !slices.Equal(got, want) {
		t.Errorf("the proxy passed %q, want %q", got, want)
	}
	// And the account's requests, with its refreshed token.
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := hp.Count(); got != 4 {
		t.Errorf("the proxy passed %d calls, want 4 (the request too): %q", got, hp.Passed())
	}
	for _, x := range e.upstream.exchanges() {
		if !hp.Opened(x.remote) {
			t.Errorf("%s %s reached the simulator direct", x.method, x.path)
		}
	}
}

// TestEgressDeadProxyFailsOver: an account whose proxy is a closed port
// fails with a transport failure naming the proxy by host (never its
// credentials), cools as unreachable, and the request fails over to
// another account and succeeds.
func TestEgressDeadProxyFailsOver(t *testing.T) {
	t.Parallel()
	password := "dead-" + randid.Hex(8)
	closed := proxytest.ClosedURL(t, "socks5")
	dead := strings.Replace(closed, "socks5://", "socks5://u:"+password+"@", 1)
	e := setup(t, options{accounts: []account{{label: "dead", priority: 10, proxy: dead}, {label: "alive"}}})
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	want := "egress proxy " + closed + " could not be reached (connection refused)"
	ev := heldFor(t, e, r)
	if len(ev.AttemptRecords) != 2 {
		t.Fatalf("attempts %v, want the dead proxy's and alive's", ev.AttemptRecords)
	}
	first, second := ev.AttemptRecords[0], ev.AttemptRecords[1]
	if first.AccountId != e.ids["dead"] || first.Class != weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR ||
		first.TransportCause != weirv1.TransportCause_TRANSPORT_CAUSE_PROXY || first.TransportError != want ||
		first.Action != weirv1.Action_ACTION_FAILOVER {
		t.Errorf("first attempt %v, want a proxy failure %q failed over", first, want)
	}
	if second.AccountId != e.ids["alive"] || second.Class != weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS {
		t.Errorf("second attempt %v, want alive's success", second)
	}
	if got := e.attempts(); len(got) != 1 || !strings.HasPrefix(got[0], "alive:") {
		t.Errorf("the simulator saw %q, want alive's request only", got)
	}
	a := e.account("dead")
	if u := a.Unreachable; u == nil || u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_PROXY || u.Error != want {
		t.Errorf("the account's run %v, want the proxy's failure", u)
	}
	if a.Cooldown == nil || a.Cooldown.Reason != weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT {
		t.Errorf("cooldown %v, want a transport cooldown", a.Cooldown)
	}
	if strings.Contains(ev.String()+a.String(), password) {
		t.Error("the proxy's password is in the route event or the account")
	}
}

// TestEgressProxyPasswordNeverLeaks: proxy passwords set every way (an
// account's own at create and update, the default, a malformed URL, a
// dead proxy) never appear in an answer, the audit log, the setting
// changes, route events, the client's responses or the servers' logs.
func TestEgressProxyPasswordNeverLeaks(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	pw := map[string]string{}
	for _, n := range []string{"own", "default", "update", "dead", "bad"} {
		pw[n] = "pw-" + n + "-" + randid.Hex(10)
	}
	own := proxytest.NewSOCKS5(t, "u", pw["own"])
	def := proxytest.NewHTTP(t, "u", pw["default"])
	upd := proxytest.NewSOCKS5(t, "u", pw["update"])
	dead := strings.Replace(proxytest.ClosedURL(t, "http"), "http://", "http://u:"+pw["dead"]+"@", 1)
	e := setup(t, options{logs: logs, accounts: []account{
		{label: "dead", priority: 10, proxy: dead}, {label: "own", priority: 5, proxy: own.URL}, {label: "plain"},
	}})
	ctx := t.Context()
	var seen strings.Builder
	keep := func(s string) { seen.WriteString(s + "\n") }
	set, err := e.settings.UpdateSettings(ctx, connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings: &weirv1.Settings{EgressProxy: def.URL}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
	if err != nil {
		t.Fatal(err)
	}
	keep(set.Msg.String())
	upd1, err := e.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{Id: "plain", EgressProxy: upd.URL,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
	if err != nil {
		t.Fatal(err)
	}
	keep(upd1.Msg.String())
	_, err = e.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{Id: "plain", EgressProxy: "ftp://u:" + pw["bad"] + "@host:21",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "egress_proxy: the scheme must be") {
		t.Errorf("a malformed proxy: %v, want InvalidArgument naming egress_proxy", err)
	}
	keep(errString(err))
	_, err = e.settings.UpdateSettings(ctx, connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings: &weirv1.Settings{EgressProxy: "socks5://u:" + pw["bad"] + "@host:1/path"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "settings.egress_proxy:") {
		t.Errorf("a malformed default: %v, want InvalidArgument naming settings.egress_proxy", err)
	}
	keep(errString(err))

	// A request fails over from the dead proxy to own's, and one goes
	// through the default (plain, back to following it).
	r := e.post(true)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	keep(string(r.body))
	keep(e.routeEvent(r.header.Get("Weir-Request-Id")).String())
	if _, err := e.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{Id: "plain", EgressProxy: "",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}})); err != nil {
		t.Fatal(err)
	}
	r = e.postAs(e.pinnedKey("plain"), false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	keep(string(r.body))
	if own.Count() == 0 || def.Count() == 0 {
		t.Fatalf("the scenario did not go through the proxies: own %d, default %d", own.Count(), def.Count())
	}

	accounts, err := e.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	keep(accounts.Msg.String())
	st, err := e.settings.GetSettings(ctx, connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	keep(st.Msg.String())
	changes, err := e.settings.ListSettingChanges(ctx, connect.NewRequest(&weirv1.ListSettingChangesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	keep(changes.Msg.String())
	audit := weirv1connect.NewAuditServiceClient(rpcclient.HTTPClient(), e.cpSrv.URL, connect.WithInterceptors(rpcclient.Token(e.admin)))
	events, err := audit.ListAuditEvents(ctx, connect.NewRequest(&weirv1.ListAuditEventsRequest{PageSize: 500}))
	if err != nil {
		t.Fatal(err)
	}
	keep(events.Msg.String())
	routes, err := e.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 100}))
	if err != nil {
		t.Fatal(err)
	}
	keep(routes.Msg.String())

	everything := seen.String() + "\n" + logs.String()
	// The scan reads what it should: the proxies by host, the audit rows
	// of the calls that set them, the dead proxy's failure.
	for _, want := range []string{"socks5://" + own.Addr, "http://" + def.Addr, "socks5://" + upd.Addr, "UpdateSettings", "could not be reached"} {
		if !strings.Contains(everything, want) {
			t.Errorf("what the scenario produced does not hold %q: the scan would prove little", want)
		}
	}
	for name, p := range pw {
		if strings.Contains(everything, p) {
			t.Errorf("the %s proxy's password appears in what the scenario produced", name)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
