package controlplane

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// sealElsewhere re-seals an account's access token (or, with refresh,
// its refresh token) under a key no replica of the test holds.
func (e *env) sealElsewhere(id, plaintext string, refresh bool) {
	e.t.Helper()
	row := e.accountRow(id)
	s := mustSealer(e.t, randid.Bytes(32))
	col, sealed := "credential_sealed", s.Seal(row.ID, row.CredentialRevision, plaintext)
	if refresh {
		col, sealed = "refresh_sealed", s.SealRefresh(row.ID, row.CredentialRevision, plaintext)
	}
	if _, err := e.pool.Exec(e.t.Context(), `UPDATE accounts SET `+col+` = $2 WHERE id = $1`, row.ID, sealed); err != nil {
		e.t.Fatal(err)
	}
}

// unreadableAccount creates an account whose credential no replica of
// the test opens.
func (e *env) unreadableAccount(a acct) *weirv1.Account {
	e.t.Helper()
	created, cred := e.createAccount(a)
	e.sealElsewhere(created.Id, cred, false)
	return created
}

// withKeys starts another replica over e's database holding current and
// previous instead of e's keys.
func (e *env) withKeys(current []byte, previous ...[]byte) *env {
	e.t.Helper()
	cfg := e.cfg
	cfg.SecretKey, cfg.PreviousSecretKeys = current, previous
	cfg.Registry, cfg.Logger = nil, nil
	r := newEnv(e.t, e.pool, cfg, e.clock)
	r.secrets = e.secrets
	return r
}

// brokenReasons is every broken account's reason, by label.
func (e *env) brokenReasons() map[string]string {
	e.t.Helper()
	rows, err := e.q.BrokenAccounts(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rows {
		out[r.Label] = r.Reason
	}
	return out
}

// wantUnreadable requires exactly labels to be broken, each for an
// unreadable credential.
func (e *env) wantUnreadable(what string, labels ...string) {
	e.t.Helper()
	got := e.brokenReasons()
	if len(got) != len(labels) {
		e.t.Errorf("%s: broken %v, want %v", what, got, labels)
	}
	for _, l := range labels {
		if got[l] != unreadableReason {
			e.t.Errorf("%s: %s broken for %q, want %q", what, l, got[l], unreadableReason)
		}
	}
}

// TestStartRefusesWrongKey: a replica whose keys open none of the stored
// credentials refuses to start, with an error naming the cause and both
// fixes (no key in it), and marks nothing; an empty pool starts with any
// key, and the right key as a previous one starts too.
func TestStartRefusesWrongKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	if err := e.srv.Start(ctx); err != nil {
		t.Fatalf("an empty pool: %v", err)
	}
	if err := e.srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	e.createAccount(acct{label: "one"})
	e.createAccount(acct{label: "two"})

	wrong := randid.Bytes(32)
	w := e.withKeys(wrong)
	err := w.srv.Start(ctx)
	var wk *WrongKeyError
	if !errors.As(err, &wk) || wk.Accounts != 2 {
		t.Fatalf("Start with the wrong key: %v; want a WrongKeyError over 2 accounts", err)
	}
	for _, want := range []string{"refusing to start", "WEIR_SECRET_KEY (key id " + seal.KeyID(wrong) + ") is not the key these credentials were sealed with",
		"set the key that sealed them as WEIR_SECRET_KEY", "add it to WEIR_SECRET_KEY_PREVIOUS and run 'weir secrets rotate'"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, key := range [][]byte{wrong, e.cfg.SecretKey} {
		if strings.Contains(err.Error(), hex.EncodeToString(key)) {
			t.Error("the error holds a key")
		}
	}
	e.wantUnreadable("after the refusal")

	// The key that sealed them, as a previous key, opens them.
	r := e.withKeys(randid.Bytes(32), e.cfg.SecretKey)
	if err := r.srv.Start(ctx); err != nil {
		t.Fatalf("Start with the sealing key as previous: %v", err)
	}
	if err := r.srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("after a start that opens everything")
}

// TestStartMarksUnreadable: in a pool where some credentials open and
// others do not (an access token, a refresh token sealed under a key this
// replica lacks), start-up marks exactly those broken for an unreadable
// credential, logs their labels, leaves an account already broken with
// its own reason, and Acquire never tries them.
func TestStartMarksUnreadable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	_, keyHash := e.createKey("")
	e.createAccount(acct{label: "good"})
	lost := e.unreadableAccount(acct{label: "lost-access", priority: 10})
	access, refresh := oauthToken(), refreshToken()
	e.secrets.add(access)
	e.secrets.add(refresh)
	max, _ := e.createAccount(acct{label: "lost-refresh", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, priority: 10,
		credential: oauthJSON(access, refresh, e.clock.Now().Add(time.Hour))})
	e.sealElsewhere(max.Id, refresh, true)
	already := e.unreadableAccount(acct{label: "already-broken"})
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET broken_at = $2, broken_reason = 'rejected' WHERE id = $1`, already.Id, e.clock.Now()); err != nil {
		t.Fatal(err)
	}

	if err := e.srv.Start(ctx); err != nil {
		t.Fatalf("Start over a mixed pool: %v", err)
	}
	t.Cleanup(func() { e.srv.Stop(t.Context()) }) //nolint:errcheck // the test is over
	got := e.brokenReasons()
	if len(got) != 3 || got["lost-access"] != unreadableReason || got["lost-refresh"] != unreadableReason || got["already-broken"] != "rejected" {
		t.Fatalf("broken after start: %v", got)
	}
	if a := e.getAccount(lost.Id); a.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN || !strings.HasPrefix(a.BrokenReason, "unreadable_credential") {
		t.Errorf("lost-access shows %v %q", a.State, a.BrokenReason)
	}
	logs := e.logs.String()
	for _, want := range []string{"credentials this control plane cannot open", "lost-access", "lost-refresh", "accounts marked broken"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log does not say %q", want)
		}
	}

	for range 3 {
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountLabel != "good" {
			t.Fatalf("lease on %s", l.AccountLabel)
		}
	}
	if strings.Contains(e.logs.String(), "credential or egress proxy unreadable") {
		t.Error("Acquire tried a broken account")
	}
}

// TestPeriodicCredentialCheck: a running replica checks again on its own
// keys, not only at start-up: a credential sealed later under a key it
// lacks (a replica already on a new key, with the old one as previous) is
// marked broken on its next check; the replica holding that key clears the
// mark on its own check, since it opens the credential.
func TestPeriodicCredentialCheck(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	e.createAccount(acct{label: "old"})
	tick := make(chan time.Time)
	e.srv.acct.creds.tick = tick
	if err := e.srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.srv.Stop(t.Context()) }) //nolint:errcheck // the test is over
	check := func() {
		// The second send waits until the first check is over.
		tick <- e.clock.Now()
		tick <- e.clock.Now()
	}
	check()
	e.wantUnreadable("nothing new")

	next := e.withKeys(randid.Bytes(32), e.cfg.SecretKey)
	next.createAccount(acct{label: "new"})
	check()
	e.wantUnreadable("after the periodic check", "new")
	// The last tick's check may still run: it must not mark "new" again
	// after the new replica mends it.
	e.srv.acct.creds.stop()

	if err := next.srv.acct.settleCredentials(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("after the new replica's check")
	if !strings.Contains(next.logs.String(), "accounts mended") {
		t.Error("the mend was not logged")
	}
}

// TestReenteredCredentialClearsUnreadable: an account marked broken for
// an unreadable credential is mended by re-entering the credential (a new
// revision sealed under the current key), serves again, and a later check
// leaves it alone.
func TestReenteredCredentialClearsUnreadable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	_, keyHash := e.createKey("")
	e.createAccount(acct{label: "good"})
	lost := e.unreadableAccount(acct{label: "lost", priority: 10})
	if err := e.srv.acct.settleCredentials(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("before", "lost")

	fresh := apiKey()
	e.secrets.add(fresh)
	resp, err := e.admin.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: lost.Id, Credential: fresh, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
	}))
	if err != nil {
		t.Fatalf("UpdateAccount: %v", err)
	}
	if a := resp.Msg.Account; a.State == weirv1.AccountState_ACCOUNT_STATE_BROKEN || a.BrokenReason != "" {
		t.Fatalf("after re-entry: %v %q", a.State, a.BrokenReason)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != lost.Id || l.Credential != fresh {
		t.Fatalf("lease on %s, want lost with its new credential", l.AccountLabel)
	}
	if err := e.srv.acct.settleCredentials(ctx); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("after another check")
}

// TestAcquireUnreadable: when no candidate's credential opens, Acquire
// answers at once with a permanent NoAccount naming the cause and the fix,
// and marks nothing (opening none, this replica may hold the wrong key).
// When another opens, the ones that did not are marked broken in the same
// Acquire, and the next does not try them.
func TestAcquireUnreadable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	e.createAccount(acct{label: "a"})
	e.createAccount(acct{label: "b"})
	e.createAccount(acct{label: "c"})

	w := e.withKeys(randid.Bytes(32))
	none := w.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)
	if !none.Permanent || none.RetryAt != nil {
		t.Errorf("permanent %v, retry at %v; want permanent with no retry", none.Permanent, none.RetryAt)
	}
	for _, want := range []string{"3 with a credential this control plane cannot decrypt", "WEIR_SECRET_KEY_PREVIOUS", "weir secrets rotate"} {
		if !strings.Contains(none.Message, want) {
			t.Errorf("message %q does not say %q", none.Message, want)
		}
	}
	e.wantUnreadable("after opening none")
	if n := e.count(`SELECT count(*) FROM leases`); n != 0 {
		t.Errorf("%d leases left behind", n)
	}

	lost := e.unreadableAccount(acct{label: "lost", priority: 10})
	rev := e.accountRow(lost.Id).CredentialRevision
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId == lost.Id {
		t.Fatal("leased the unreadable account")
	}
	e.wantUnreadable("after a lease past it", "lost")
	if row := e.accountRow(lost.Id); row.CredentialRevision != rev {
		t.Errorf("revision %d → %d", rev, row.CredentialRevision)
	}
	tried := strings.Count(e.logs.String(), "credential or egress proxy unreadable")
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	if n := strings.Count(e.logs.String(), "credential or egress proxy unreadable"); n != tried {
		t.Errorf("the next Acquire tried the marked account again")
	}
}

// TestMarkUnreadableIsCompareAndSet: a mark written for a revision that
// has since been replaced changes nothing.
func TestMarkUnreadableIsCompareAndSet(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "a"})
	row := e.accountRow(a.Id)
	stale := sealedRef{id: uuid.MustParse(a.Id), label: "a", revision: row.CredentialRevision - 1}
	if err := e.srv.acct.markUnreadable(e.t.Context(), []sealedRef{stale}); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("a stale revision")
}
