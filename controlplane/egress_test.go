package controlplane

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// setDefaultProxy sets the egress_proxy setting.
func (e *env) setDefaultProxy(url string) (*weirv1.Settings, error) {
	e.t.Helper()
	res, err := e.settingsClient(e.cfg.AdminToken).UpdateSettings(e.t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings: &weirv1.Settings{EgressProxy: url}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Settings, nil
}

// createWithProxy creates an API-key account with an egress proxy.
func (e *env) createWithProxy(label string, priority int32, proxy string) (*weirv1.Account, error) {
	e.t.Helper()
	cred := apiKey()
	e.secrets.add(cred)
	res, err := e.admin.accounts.CreateAccount(e.t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
		Label: label, Credential: cred, Priority: priority, EgressProxy: proxy}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Account, nil
}

// TestEgressProxySealedAtRest: an account's proxy and the default are
// stored sealed (their passwords nowhere in the clear: not in the rows,
// the setting changes, the answers or the log), shown by host, and a
// lease carries the whole URL the account's traffic goes through: its
// own, the default's, or none when it says direct.
func TestEgressProxySealedAtRest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	ownPW, defPW := "own-"+randid.Hex(10), "def-"+randid.Hex(10)
	e.secrets.add(ownPW)
	e.secrets.add(defPW)
	ownURL, defURL := "socks5://user:"+ownPW+"@10.0.0.7:1080", "http://user:"+defPW+"@proxy.internal:3128"
	_, keyHash := e.createKey("")

	own, err := e.createWithProxy("own", 30, ownURL)
	if err != nil {
		t.Fatal(err)
	}
	if own.EgressProxy != "socks5://10.0.0.7:1080" || own.EgressVia != own.EgressProxy {
		t.Errorf("created: egress_proxy %q, egress_via %q", own.EgressProxy, own.EgressVia)
	}
	requireAbsent(t, "CreateAccount", own, ownPW)
	st, err := e.setDefaultProxy(defURL)
	if err != nil || st.EgressProxy != "http://proxy.internal:3128" {
		t.Fatalf("set the default: %v, %v", st, err)
	}
	requireAbsent(t, "UpdateSettings", st, defPW)
	follows, err := e.createWithProxy("follows", 20, "")
	if err != nil {
		t.Fatal(err)
	}
	direct, err := e.createWithProxy("direct", 10, "direct")
	if err != nil {
		t.Fatal(err)
	}
	if follows.EgressProxy != "" || follows.EgressVia != "http://proxy.internal:3128" || direct.EgressProxy != "direct" || direct.EgressVia != "" {
		t.Errorf("follows %q/%q, direct %q/%q", follows.EgressProxy, follows.EgressVia, direct.EgressProxy, direct.EgressVia)
	}

	// At rest: the shown forms in the clear, the URLs sealed.
	row := e.accountRow(own.Id)
	if row.EgressProxy != "socks5://10.0.0.7:1080" || bytes.Contains(row.EgressProxySealed, []byte(ownPW)) {
		t.Errorf("the account's row: egress_proxy %q, the password in the sealed bytes %v", row.EgressProxy, bytes.Contains(row.EgressProxySealed, []byte(ownPW)))
	}
	if got, err := e.srv.seal.OpenProxy(row.ID, row.EgressProxySealed); err != nil || got != ownURL {
		t.Errorf("the sealed proxy does not open to the URL: %v", err)
	}
	shown, sealed, err := egressDefault(ctx, e.q)
	if err != nil || shown != "http://proxy.internal:3128" || sealed == nil || bytes.Contains(sealed, []byte(defPW)) {
		t.Errorf("the default's row: %q, %d sealed bytes, %v", shown, len(sealed), err)
	}
	var clear int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM settings s, setting_changes c
		WHERE s.value LIKE '%' || $1 || '%' OR c.old_value LIKE '%' || $1 || '%' OR c.new_value LIKE '%' || $1 || '%'`, defPW).Scan(&clear); err != nil || clear != 0 {
		t.Errorf("the default's password in the settings or their changes: %d rows, %v", clear, err)
	}
	changes, err := e.settingsClient(e.cfg.AdminToken).ListSettingChanges(ctx, connect.NewRequest(&weirv1.ListSettingChangesRequest{}))
	if err != nil || len(changes.Msg.Changes) != 1 || changes.Msg.Changes[0].NewValue != "http://proxy.internal:3128" {
		t.Errorf("setting changes %v, %v", changes, err)
	}

	// Leases carry the whole URL, own, default or none.
	for _, want := range []struct {
		label, proxy string
		pause        string
	}{{"own", ownURL, "own"}, {"follows", defURL, "follows"}, {"direct", "", ""}} {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		if l.AccountLabel != want.label || l.EgressProxy != want.proxy {
			t.Errorf("lease on %s carries the proxy %q, want %s's %q", l.AccountLabel, egressShown(l.EgressProxy), want.label, egressShown(want.proxy))
		}
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED})
		if want.pause != "" {
			e.pause(want.pause)
		}
	}

	// "" follows the default again; "direct" for the default is none.
	upd, err := e.admin.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{Id: "own", EgressProxy: "",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"egress_proxy"}}}))
	if err != nil || upd.Msg.Account.EgressProxy != "" || upd.Msg.Account.EgressVia != "http://proxy.internal:3128" || e.accountRow(own.Id).EgressProxySealed != nil {
		t.Errorf("own back to the default: %v, %v", upd, err)
	}
	if st, err := e.setDefaultProxy("direct"); err != nil || st.EgressProxy != "" {
		t.Errorf("the default set to direct: %v, %v", st, err)
	}
	if a := e.getAccount(follows.Id); a.EgressVia != "" {
		t.Errorf("follows goes through %q with no default", a.EgressVia)
	}
}

// egressShown is a URL as a test may print it.
func egressShown(u string) string {
	if u == "" {
		return "(direct)"
	}
	return strings.SplitN(u, "@", 2)[len(strings.SplitN(u, "@", 2))-1]
}

// TestEgressProxyRefused: a malformed proxy or one of another scheme is
// refused, naming the field and never quoting the URL.
func TestEgressProxyRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pw := "bad-" + randid.Hex(10)
	e.secrets.add(pw)
	for _, raw := range []string{
		"ftp://u:" + pw + "@host:21", "socks5://u:" + pw + "@host:1/x", "http://u:" + pw + "@host:99999",
		"u:" + pw + "@host:1", "socks4://u:" + pw + "@host:1080", "socks5://u:" + pw + "@",
	} {
		_, err := e.createWithProxy("x-"+randid.Hex(3), 0, raw)
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.HasPrefix(ce.Message(), "egress_proxy: ") || strings.Contains(ce.Error(), pw) {
			t.Errorf("CreateAccount with a bad proxy: %q", ce.Message())
		}
		_, err = e.setDefaultProxy(raw)
		ce = wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.HasPrefix(ce.Message(), "settings.egress_proxy: ") || strings.Contains(ce.Error(), pw) {
			t.Errorf("UpdateSettings with a bad proxy: %q", ce.Message())
		}
	}
	if n := e.count(`SELECT count(*) FROM accounts`); n != 0 {
		t.Errorf("%d accounts created with bad proxies", n)
	}
}

// TestEgressProxyUnreadable: an account whose sealed proxy opens with
// none of the keys is never leased (nothing goes out direct instead), and
// the credential check names it.
func TestEgressProxyUnreadable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	bad, err := e.createWithProxy("bad", 10, "socks5://127.0.0.1:1080")
	if err != nil {
		t.Fatal(err)
	}
	e.createAccount(acct{label: "good"})
	other := mustSealer(t, randid.Bytes(32))
	if _, err := e.pool.Exec(t.Context(), `UPDATE accounts SET egress_proxy_sealed = $2 WHERE id = $1`,
		bad.Id, other.SealProxy(uuid.MustParse(bad.Id), "socks5://127.0.0.1:1080")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		if l.AccountLabel != "good" {
			t.Fatalf("leased %s, whose proxy does not open", l.AccountLabel)
		}
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED})
	}
	if got, err := e.srv.acct.CheckCredentials(t.Context()); err != nil || !slices.Equal(got, []string{"bad"}) {
		t.Errorf("the check names %v, %v; want bad", got, err)
	}
}

// TestResealEgressProxies: a key rotation re-seals the accounts' proxies
// and the default under the new key; a default that opens with no key
// fails it, named.
func TestResealEgressProxies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	a, b := e.cfg.SecretKey, randid.Bytes(32)
	ownURL, defURL := "socks5://u:p1@10.0.0.7:1080", "http://u:p2@proxy.internal:3128"
	own, err := e.createWithProxy("own", 0, ownURL)
	if err != nil {
		t.Fatal(err)
	}
	e.createAccount(acct{label: "plain"})
	if _, err := e.setDefaultProxy(defURL); err != nil {
		t.Fatal(err)
	}
	rep, err := Reseal(ctx, e.pool, b, [][]byte{a}, false)
	if err != nil || rep != (ResealReport{KeyID: seal.KeyID(b), Accounts: 2, Stale: 2, Resealed: 2, StaleSettings: 1, ResealedSettings: 1}) {
		t.Fatalf("rotate: %+v, %v", rep, err)
	}
	onlyB := mustSealer(t, b)
	row := e.accountRow(own.Id)
	if got, err := onlyB.OpenProxy(row.ID, row.EgressProxySealed); err != nil || got != ownURL {
		t.Errorf("B alone opens the account's proxy: %v", err)
	}
	_, sealed, err := egressDefault(ctx, e.q)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := onlyB.OpenProxy(uuid.Nil, sealed); err != nil || got != defURL {
		t.Errorf("B alone opens the default: %v", err)
	}
	if rep, err := Reseal(ctx, e.pool, b, [][]byte{a}, false); err != nil || rep.Stale+rep.StaleSettings != 0 {
		t.Errorf("second run: %+v, %v; want nothing stale", rep, err)
	}

	if _, err := e.pool.Exec(ctx, `UPDATE settings SET sealed = $1 WHERE name = 'egress_proxy'`,
		mustSealer(t, randid.Bytes(32)).SealProxy(uuid.Nil, defURL)); err != nil {
		t.Fatal(err)
	}
	_, err = Reseal(ctx, e.pool, randid.Bytes(32), [][]byte{b}, false)
	var unreadable *UnreadableError
	if !errors.As(err, &unreadable) || !slices.Equal(unreadable.Settings, []string{"egress_proxy"}) || len(unreadable.Accounts) != 0 {
		t.Errorf("an unreadable default: %v", err)
	}
}

// TestDashboardShowsEgress: the accounts page shows each account's egress
// by host (its own, the default's, or direct when it bypasses one), and
// never a proxy's password.
func TestDashboardShowsEgress(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pw, defPW := "dash-"+randid.Hex(10), "dash-def-"+randid.Hex(10)
	e.secrets.add(pw)
	e.secrets.add(defPW)
	for label, proxy := range map[string]string{"own": "socks5h://u:" + pw + "@egress.example:1080", "follows": "", "bypass": "direct"} {
		if _, err := e.createWithProxy(label, 0, proxy); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.setDefaultProxy("https://u:" + defPW + "@proxy.internal:8443"); err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	b.login(e.cfg.AdminToken)
	p := b.get("/dashboard/")
	wantStatus(t, "accounts page", p, 200)
	for _, want := range []string{"socks5h://egress.example:1080", "https://proxy.internal:8443 (default)", "direct (bypasses the default proxy)"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the accounts page does not show %q", want)
		}
	}
	settings := b.get("/dashboard/settings")
	for _, body := range []string{p.body, settings.body} {
		if strings.Contains(body, pw) || strings.Contains(body, defPW) {
			t.Error("a proxy's password is on a dashboard page")
		}
	}
}

// TestNewDefaultProxyClearsTransportCooldowns: a new default proxy voids
// the transport cooldowns of the accounts that go through it, and only
// theirs: an account with its own proxy keeps its verdict.
func TestNewDefaultProxyClearsTransportCooldowns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	follows, err := e.createWithProxy("follows", 10, "")
	if err != nil {
		t.Fatal(err)
	}
	own, err := e.createWithProxy("own", 5, "socks5://127.0.0.1:1080")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"follows", "own"} {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		if l.AccountLabel != want {
			t.Fatalf("leased %s, want %s", l.AccountLabel, want)
		}
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR,
			TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_PROXY, TransportError: "egress proxy socks5://127.0.0.1:1080 could not be reached (connection refused)"})
	}
	if e.cooldownRow(follows.Id) == nil || e.cooldownRow(own.Id) == nil {
		t.Fatal("the transport failures cooled nothing")
	}
	if _, err := e.setDefaultProxy("socks5://10.0.0.9:1080"); err != nil {
		t.Fatal(err)
	}
	if c := e.cooldownRow(follows.Id); c != nil {
		t.Errorf("follows still cools (%s) after a new default", c.Reason)
	}
	if e.cooldownRow(own.Id) == nil {
		t.Error("own's cooldown went with the default's change")
	}
}
