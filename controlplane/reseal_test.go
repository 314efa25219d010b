package controlplane

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

func mustSealer(t *testing.T, current []byte, previous ...[]byte) *seal.Sealer {
	t.Helper()
	s, err := seal.New(current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sealV1 seals an account's credential as weir did before key ids, a
// format seal still opens: version 1, nonce, AES-256-GCM ciphertext whose
// associated data is the account id and the revision alone.
func sealV1(t *testing.T, key []byte, account uuid.UUID, revision int64, plaintext string) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := randid.Bytes(aead.NonceSize())
	ad := binary.BigEndian.AppendUint64(bytes.Clone(account[:]), uint64(revision))
	return aead.Seal(append([]byte{1}, nonce...), nonce, []byte(plaintext), ad)
}

// sealedRows reads every account's sealed columns, by label.
func (e *env) sealedRows() map[string]db.SealedCredentialsRow {
	e.t.Helper()
	rows, err := e.q.SealedCredentials(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]db.SealedCredentialsRow{}
	for _, r := range rows {
		out[r.Label] = r
	}
	return out
}

// TestResealRotatesKey: credentials sealed under key A (a version 1 seal
// among them) are re-sealed under B with A as the previous key; then
// every row opens with B alone, as a current seal, at the same revision
// and usage epoch; a replica holding only B leases them; a second run
// changes nothing. A dry run before counts and writes nothing.
func TestResealRotatesKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	a, b := e.cfg.SecretKey, randid.Bytes(32)
	_, keyHash := e.createKey("")
	api, apiCred := e.createAccount(acct{label: "api", priority: 10})
	access, refresh := oauthToken(), refreshToken()
	e.secrets.add(access)
	e.secrets.add(refresh)
	e.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH,
		credential: oauthJSON(access, refresh, e.clock.Now().Add(time.Hour))})
	old, oldCred := e.createAccount(acct{label: "old"})
	// "old" was sealed before key ids existed.
	oldRow := e.accountRow(old.Id)
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET credential_sealed = $2 WHERE id = $1`,
		old.Id, sealV1(t, a, oldRow.ID, oldRow.CredentialRevision, oldCred)); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{"api": {apiCred, ""}, "max": {access, refresh}, "old": {oldCred, ""}}
	epochs := e.count(`SELECT sum(epoch) FROM usage_polls`)
	before := e.sealedRows()

	rep, err := Reseal(ctx, e.pool, b, [][]byte{a}, true)
	if err != nil || rep != (ResealReport{KeyID: seal.KeyID(b), Accounts: 3, Stale: 3}) {
		t.Fatalf("dry run: %+v, %v", rep, err)
	}
	for label, r := range e.sealedRows() {
		if !bytes.Equal(r.CredentialSealed, before[label].CredentialSealed) || !bytes.Equal(r.RefreshSealed, before[label].RefreshSealed) {
			t.Fatalf("the dry run changed %s", label)
		}
	}

	rep, err = Reseal(ctx, e.pool, b, [][]byte{a}, false)
	if err != nil || rep != (ResealReport{KeyID: seal.KeyID(b), Accounts: 3, Stale: 3, Resealed: 3}) {
		t.Fatalf("rotate: %+v, %v", rep, err)
	}
	onlyB := mustSealer(t, b)
	after := e.sealedRows()
	for label, r := range after {
		if r.CredentialRevision != before[label].CredentialRevision {
			t.Errorf("%s: revision %d, was %d", label, r.CredentialRevision, before[label].CredentialRevision)
		}
		got, err := onlyB.Open(r.ID, r.CredentialRevision, r.CredentialSealed)
		current := onlyB.Current(r.CredentialSealed)
		if err != nil || !current || got != want[label][0] {
			t.Errorf("%s: B alone opens the credential: %v, current %v, matches %v", label, err, current, got == want[label][0])
		}
		if want[label][1] == "" {
			if r.RefreshSealed != nil {
				t.Errorf("%s: a refresh token appeared", label)
			}
			continue
		}
		got, err = onlyB.OpenRefresh(r.ID, r.CredentialRevision, r.RefreshSealed)
		current = onlyB.Current(r.RefreshSealed)
		if err != nil || !current || got != want[label][1] {
			t.Errorf("%s: B alone opens the refresh token: %v, current %v, matches %v", label, err, current, got == want[label][1])
		}
	}
	if n := e.count(`SELECT sum(epoch) FROM usage_polls`); n != epochs {
		t.Errorf("usage epochs moved (%d → %d): a re-seal is not a new credential", epochs, n)
	}

	rep, err = Reseal(ctx, e.pool, b, [][]byte{a}, false)
	if err != nil || rep != (ResealReport{KeyID: seal.KeyID(b), Accounts: 3}) {
		t.Fatalf("second run: %+v, %v; want nothing stale", rep, err)
	}
	for label, r := range e.sealedRows() {
		if !bytes.Equal(r.CredentialSealed, after[label].CredentialSealed) || !bytes.Equal(r.RefreshSealed, after[label].RefreshSealed) {
			t.Errorf("the second run rewrote %s", label)
		}
	}

	// A replica that knows only B serves the rotated credentials.
	cfg := e.cfg
	cfg.SecretKey, cfg.PreviousSecretKeys = b, nil
	cfg.Registry, cfg.Logger = nil, nil
	rb := newEnv(t, e.pool, cfg, e.clock)
	rb.secrets = e.secrets
	if l := rb.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != api.Id || l.Credential != apiCred {
		t.Fatalf("lease on %s under key B alone", l.AccountLabel)
	}
	if got, err := rb.srv.acct.CheckCredentials(ctx); err != nil || len(got) != 0 {
		t.Fatalf("key B alone: unreadable %v, %v", got, err)
	}
}

// TestResealUnreadable: a credential that opens with none of the keys
// fails the rotation naming that account (id and label, no secret), and
// nothing is re-sealed, not even the accounts that could be.
func TestResealUnreadable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	a, b := e.cfg.SecretKey, randid.Bytes(32)
	_, goodCred := e.createAccount(acct{label: "good"})
	lost, lostCred := e.createAccount(acct{label: "lost"})
	lostRow := e.accountRow(lost.Id)
	elsewhere := mustSealer(t, randid.Bytes(32))
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET credential_sealed = $2 WHERE id = $1`,
		lost.Id, elsewhere.Seal(lostRow.ID, lostRow.CredentialRevision, lostCred)); err != nil {
		t.Fatal(err)
	}
	before := e.sealedRows()

	for _, dry := range []bool{true, false} {
		rep, err := Reseal(ctx, e.pool, b, [][]byte{a}, dry)
		var unreadable *UnreadableError
		if !errors.As(err, &unreadable) {
			t.Fatalf("dry run %v: %+v, %v; want an UnreadableError", dry, rep, err)
		}
		if len(unreadable.Accounts) != 1 || unreadable.Accounts[0] != (AccountRef{ID: uuid.MustParse(lost.Id), Label: "lost"}) {
			t.Fatalf("unreadable %v, want lost alone", unreadable.Accounts)
		}
		msg := err.Error()
		if !strings.Contains(msg, lost.Id) || !strings.Contains(msg, "lost") {
			t.Errorf("error %q does not name the account", msg)
		}
		if strings.Contains(msg, goodCred) || strings.Contains(msg, lostCred) {
			t.Error("the error holds a credential")
		}
		if rep.Resealed != 0 {
			t.Errorf("resealed %d", rep.Resealed)
		}
	}
	for label, r := range e.sealedRows() {
		if !bytes.Equal(r.CredentialSealed, before[label].CredentialSealed) {
			t.Errorf("%s was rewritten by a failed rotation", label)
		}
	}
}

// TestResealWaitsForConcurrentWrite: a credential rewritten while the
// rotation runs (a token refresh by a replica still on the old key, at
// revision + 1) is not overwritten with the old ciphertext; the rotation
// waits for the row, reads what was written and re-seals that.
func TestResealWaitsForConcurrentWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	a, b := e.cfg.SecretKey, randid.Bytes(32)
	acc, _ := e.createAccount(acct{label: "busy"})
	row := e.accountRow(acc.Id)
	fresh := apiKey()
	e.secrets.add(fresh)

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, acc.Id); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rep ResealReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Reseal(ctx, e.pool, b, [][]byte{a}, false)
		done <- result{rep, err}
	}()
	// Wait until the rotation waits on the row lock.
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		select {
		case r := <-done:
			t.Fatalf("the rotation finished without waiting for the locked row: %+v, %v", r.rep, r.err)
		case <-deadline:
			t.Fatal("the rotation never waited for the row lock")
		case <-tick.C:
		}
	}
	// The refresh of an old-key replica lands first.
	if _, err := tx.Exec(ctx, `UPDATE accounts SET credential_sealed = $2, credential_revision = credential_revision + 1 WHERE id = $1`,
		acc.Id, mustSealer(t, a).Seal(row.ID, row.CredentialRevision+1, fresh)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.rep.Resealed != 1 {
		t.Fatalf("rotate: %+v, %v", r.rep, r.err)
	}
	now := e.accountRow(acc.Id)
	onlyB := mustSealer(t, b)
	got, err := onlyB.Open(now.ID, now.CredentialRevision, now.CredentialSealed)
	current := onlyB.Current(now.CredentialSealed)
	if now.CredentialRevision != row.CredentialRevision+1 || err != nil || !current || got != fresh {
		t.Fatalf("revision %d, open under B alone: %v, current %v, the refreshed credential %v", now.CredentialRevision, err, current, got == fresh)
	}
}

// TestResealTargets: notification targets sealed under key A are re-sealed
// under B (A previous): their URL and secret then open with B alone; a
// dry run first writes nothing, a second run finds nothing stale; a target
// no key opens fails the rotation and names it.
func TestResealTargets(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	a, b := e.cfg.SecretKey, randid.Bytes(32)
	hookURL, chatURL := "https://hooks.example.com/h/"+randid.Hex(8), "https://hooks.slack.com/services/"+randid.Hex(8)
	hook := e.createTarget(&weirv1.CreateTargetRequest{Name: "hook", Url: hookURL})
	e.createTarget(&weirv1.CreateTargetRequest{Name: "chat", Kind: weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_SLACK, Url: chatURL})
	seals := func() map[string]db.LockNotifyTargetSealsRow {
		t.Helper()
		rows, err := e.q.LockNotifyTargetSeals(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]db.LockNotifyTargetSealsRow{}
		for _, r := range rows {
			out[r.Name] = r
		}
		return out
	}
	before := seals()
	if rep, err := ResealTargets(ctx, e.pool, b, [][]byte{a}, true); err != nil || rep != (TargetResealReport{Targets: 2, Stale: 2}) {
		t.Fatalf("dry run: %+v, %v", rep, err)
	}
	if !bytes.Equal(seals()["hook"].UrlSealed, before["hook"].UrlSealed) {
		t.Fatal("the dry run wrote")
	}
	if rep, err := ResealTargets(ctx, e.pool, b, [][]byte{a}, false); err != nil || rep != (TargetResealReport{Targets: 2, Stale: 2, Resealed: 2}) {
		t.Fatalf("rotation: %+v, %v", rep, err)
	}
	onlyB := mustSealer(t, b)
	after := seals()
	for name, want := range map[string]string{"hook": hookURL, "chat": chatURL} {
		if got, err := onlyB.OpenTarget(after[name].ID, targetURLField, after[name].UrlSealed); err != nil || got != want {
			t.Errorf("%s's URL under B alone: %v", name, err)
		}
	}
	if got, err := onlyB.OpenTarget(after["hook"].ID, targetSecretField, after["hook"].SecretSealed); err != nil || got != hook.Secret {
		t.Errorf("hook's secret under B alone: %v", err)
	}
	if after["chat"].SecretSealed != nil {
		t.Error("the Slack target got a secret")
	}
	if rep, err := ResealTargets(ctx, e.pool, b, nil, false); err != nil || rep != (TargetResealReport{Targets: 2}) {
		t.Errorf("second run: %+v, %v", rep, err)
	}
	// Sealed under a key the rotation lacks.
	e.exec(`UPDATE notify_targets SET url_sealed = $1 WHERE name = 'chat'`,
		mustSealer(t, randid.Bytes(32)).SealTarget(after["chat"].ID, targetURLField, chatURL))
	_, err := ResealTargets(ctx, e.pool, randid.Bytes(32), [][]byte{b}, false)
	if err == nil || !strings.Contains(err.Error(), "(chat)") || strings.Contains(err.Error(), chatURL) {
		t.Errorf("an unreadable target: %v", err)
	}
	if !bytes.Equal(seals()["hook"].UrlSealed, after["hook"].UrlSealed) {
		t.Error("a failed rotation wrote")
	}
}
