package controlplane

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestCreateAccountNeverReturnsCredential(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		name       string
		kind       weirv1.AuthKind
		credential string
		hintPrefix string
	}{
		{"api_key", weirv1.AuthKind_AUTH_KIND_API_KEY, apiKey(), "sk-ant-api03-…"},
		{"oauth", weirv1.AuthKind_AUTH_KIND_OAUTH, oauthToken(), "sk-ant-oat01-…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.secrets.add(tc.credential)
			resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
				Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: tc.kind,
				Label: "acct-" + tc.name, Credential: tc.credential,
			}))
			if err != nil {
				t.Fatalf("CreateAccount: %v", err)
			}
			a := resp.Msg.Account
			requireAbsent(t, "CreateAccount", resp.Msg, tc.credential)
			if a.AuthKind != tc.kind || a.Provider != weirv1.Provider_PROVIDER_ANTHROPIC {
				t.Errorf("kind/provider %v/%v", a.AuthKind, a.Provider)
			}
			if want := tc.hintPrefix + tc.credential[len(tc.credential)-4:]; a.CredentialHint != want {
				t.Errorf("hint %q, want %q", a.CredentialHint, want)
			}
			if a.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || a.CredentialRevision != 1 ||
				a.MaxConcurrency != defaultMaxConcurrency || a.Cooldown != nil || a.InFlight != 0 {
				t.Errorf("fresh account: %v", a)
			}
			if !a.CreatedAt.AsTime().Equal(epoch) || !a.UpdatedAt.AsTime().Equal(epoch) {
				t.Errorf("timestamps %v/%v, want the injected clock %v", a.CreatedAt.AsTime(), a.UpdatedAt.AsTime(), epoch)
			}

			got, err := e.admin.accounts.GetAccount(t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: a.Id}))
			if err != nil {
				t.Fatalf("GetAccount: %v", err)
			}
			requireAbsent(t, "GetAccount", got.Msg, tc.credential)
			list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
			if err != nil {
				t.Fatalf("ListAccounts: %v", err)
			}
			requireAbsent(t, "ListAccounts", list.Msg, tc.credential)

			// At rest: the sealed bytes do not hold the plaintext, nor
			// does any other column.
			row := e.accountRow(a.Id)
			if bytes.Contains(row.CredentialSealed, []byte(tc.credential)) {
				t.Error("credential_sealed holds the plaintext")
			}
			if n := e.count(`SELECT count(*) FROM accounts WHERE strpos(row_to_json(accounts)::text, $1) > 0`, tc.credential); n != 0 {
				t.Error("the accounts row holds the plaintext in some column")
			}
			if n := e.count(`SELECT count(*) FROM accounts WHERE strpos(encode(credential_sealed, 'escape'), $1) > 0`, tc.credential); n != 0 {
				t.Error("credential_sealed holds the plaintext")
			}
		})
	}
}

func TestCreateAccountValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	valid := func() *weirv1.CreateAccountRequest {
		return &weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label: "ok", Credential: "sk-ant-api03-abcdefgh12345678",
		}
	}
	for _, tc := range []struct {
		name  string
		mod   func(r *weirv1.CreateAccountRequest)
		field string
	}{
		{"no provider", func(r *weirv1.CreateAccountRequest) { r.Provider = weirv1.Provider_PROVIDER_UNSPECIFIED }, "provider"},
		{"unknown provider", func(r *weirv1.CreateAccountRequest) { r.Provider = 99 }, "provider"},
		{"no auth kind", func(r *weirv1.CreateAccountRequest) { r.AuthKind = weirv1.AuthKind_AUTH_KIND_UNSPECIFIED }, "auth_kind"},
		{"unknown auth kind", func(r *weirv1.CreateAccountRequest) { r.AuthKind = 42 }, "auth_kind"},
		{"empty label", func(r *weirv1.CreateAccountRequest) { r.Label = "" }, "label"},
		{"long label", func(r *weirv1.CreateAccountRequest) { r.Label = strings.Repeat("a", 65) }, "label"},
		{"padded label", func(r *weirv1.CreateAccountRequest) { r.Label = " ok" }, "label"},
		{"label like an id", func(r *weirv1.CreateAccountRequest) { r.Label = "0b7a7d3c-5c4e-4a52-9a43-1a3b2c4d5e6f" }, "label"},
		{"empty credential", func(r *weirv1.CreateAccountRequest) { r.Credential = "" }, "credential"},
		{"short credential", func(r *weirv1.CreateAccountRequest) { r.Credential = "sk-1234" }, "credential"},
		{"credential with space", func(r *weirv1.CreateAccountRequest) { r.Credential = "sk-ant-api03 abcdefgh" }, "credential"},
		{"credential too long", func(r *weirv1.CreateAccountRequest) { r.Credential = strings.Repeat("k", 8193) }, "credential"},
		{"base url scheme", func(r *weirv1.CreateAccountRequest) { r.BaseUrl = "ftp://example.com" }, "base_url"},
		{"base url no host", func(r *weirv1.CreateAccountRequest) { r.BaseUrl = "https://" }, "base_url"},
		{"base url relative", func(r *weirv1.CreateAccountRequest) { r.BaseUrl = "/v1" }, "base_url"},
		{"base url garbage", func(r *weirv1.CreateAccountRequest) { r.BaseUrl = "http://[::1" }, "base_url"},
		{"base url userinfo", func(r *weirv1.CreateAccountRequest) { r.BaseUrl = "https://user:hunter2-pw@example.com" }, "base_url"},
		{"base url query", func(r *weirv1.CreateAccountRequest) { r.BaseUrl = "https://example.com/?k=v" }, "base_url"},
		{"negative concurrency", func(r *weirv1.CreateAccountRequest) { r.MaxConcurrency = -1 }, "max_concurrency"},
		{"huge concurrency", func(r *weirv1.CreateAccountRequest) { r.MaxConcurrency = 10001 }, "max_concurrency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := valid()
			tc.mod(req)
			_, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(req))
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.HasPrefix(ce.Message(), tc.field+":") {
				t.Errorf("message %q does not name %s", ce.Message(), tc.field)
			}
			for _, secret := range []string{req.Credential, "hunter2-pw"} {
				if len(secret) >= 8 && strings.Contains(ce.Message(), secret) {
					t.Errorf("message %q echoes a secret", ce.Message())
				}
			}
		})
	}
	if n := e.count(`SELECT count(*) FROM accounts`); n != 0 {
		t.Errorf("%d accounts created by invalid requests", n)
	}

	// The bounds themselves are fine; a trailing slash is trimmed.
	a, _ := e.createAccount(acct{label: strings.Repeat("b", 64), maxConc: 10000, baseURL: "http://127.0.0.1:9/"})
	if a.MaxConcurrency != 10000 || a.BaseUrl != "http://127.0.0.1:9" {
		t.Errorf("bounds: max %d base %q", a.MaxConcurrency, a.BaseUrl)
	}
	b, _ := e.createAccount(acct{maxConc: 1, priority: -5})
	if b.MaxConcurrency != 1 || b.Priority != -5 {
		t.Errorf("max %d priority %d", b.MaxConcurrency, b.Priority)
	}
}

func TestCreateAccountDuplicateLabel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createAccount(acct{label: "dup"})
	_, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH,
		Label: "dup", Credential: oauthToken(),
	}))
	wantCode(t, err, connect.CodeAlreadyExists)
}

func TestGetAccount(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "by-label"})
	for _, ref := range []string{a.Id, "by-label", strings.ToUpper(a.Id)} {
		if got := e.getAccount(ref); got.Id != a.Id || got.Label != "by-label" {
			t.Errorf("GetAccount(%q) = %s", ref, got.Id)
		}
	}
	for _, tc := range []struct {
		ref  string
		code connect.Code
	}{
		{"nope", connect.CodeNotFound},
		{"7c4e9f5e-0000-4000-8000-000000000000", connect.CodeNotFound},
		{"", connect.CodeInvalidArgument},
	} {
		_, err := e.admin.accounts.GetAccount(t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: tc.ref}))
		wantCode(t, err, tc.code)
	}
	// Every by-id RPC agrees on a missing account.
	missing := "7c4e9f5e-0000-4000-8000-000000000001"
	_, err := e.admin.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: missing}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.admin.accounts.ResumeAccount(t.Context(), connect.NewRequest(&weirv1.ResumeAccountRequest{Id: missing}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: missing}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: missing, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"priority"}},
	}))
	wantCode(t, err, connect.CodeNotFound)
}

func TestListAccountsOrderAndLiveState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	e.createAccount(acct{label: "zulu"})
	b, _ := e.createAccount(acct{label: "alpha", maxConc: 3})
	e.createAccount(acct{label: "mike"})
	e.pause("zulu")
	e.pause("mike")
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})

	list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, a := range list.Msg.Accounts {
		labels = append(labels, a.Label)
	}
	if strings.Join(labels, ",") != "alpha,mike,zulu" {
		t.Errorf("order %v, want by label", labels)
	}
	if a := list.Msg.Accounts[0]; a.InFlight != 2 || a.LastUsedAt == nil || !a.LastUsedAt.AsTime().Equal(epoch) {
		t.Errorf("alpha: in_flight %d last_used %v", a.InFlight, a.LastUsedAt)
	}
	// Leases stop counting when they expire.
	e.clock.Advance(e.cfg.LeaseTTL + time.Second)
	if got := e.getAccount(b.Id); got.InFlight != 0 {
		t.Errorf("in_flight after expiry %d", got.InFlight)
	}
}

func TestUpdateAccount(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, oldCred := e.createAccount(acct{label: "before", baseURL: "http://127.0.0.1:1"})
	e.createAccount(acct{label: "taken"})
	mask := func(p ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: p} }
	update := func(req *weirv1.UpdateAccountRequest) (*weirv1.Account, error) {
		resp, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Account, nil
	}

	e.clock.Advance(time.Minute)
	// Only the named fields change; the others in the message are ignored.
	got, err := update(&weirv1.UpdateAccountRequest{
		Id: a.Id, UpdateMask: mask("label", "base_url", "max_concurrency", "priority"),
		Label: "after", BaseUrl: "https://proxy.example.com/", MaxConcurrency: 7, Priority: 3,
		Credential: "sk-ant-api03-ignored-not-in-mask",
	})
	if err != nil {
		t.Fatalf("UpdateAccount: %v", err)
	}
	if got.Label != "after" || got.BaseUrl != "https://proxy.example.com" || got.MaxConcurrency != 7 || got.Priority != 3 ||
		got.CredentialRevision != 1 || got.CredentialHint != a.CredentialHint {
		t.Errorf("after update: %v", got)
	}
	if !got.UpdatedAt.AsTime().Equal(epoch.Add(time.Minute)) || !got.CreatedAt.AsTime().Equal(epoch) {
		t.Errorf("updated_at %v created_at %v", got.UpdatedAt.AsTime(), got.CreatedAt.AsTime())
	}
	got, err = update(&weirv1.UpdateAccountRequest{Id: "after", UpdateMask: mask("priority"), Label: "ignored", Priority: -1})
	if err != nil || got.Label != "after" || got.Priority != -1 || got.MaxConcurrency != 7 {
		t.Fatalf("priority-only update: %v %v", got, err)
	}

	for _, tc := range []struct {
		name string
		req  *weirv1.UpdateAccountRequest
		code connect.Code
		msg  string
	}{
		{"nil mask", &weirv1.UpdateAccountRequest{Id: a.Id}, connect.CodeInvalidArgument, "update_mask"},
		{"empty mask", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask()}, connect.CodeInvalidArgument, "update_mask"},
		{"unknown path", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("priority", "paused")}, connect.CodeInvalidArgument, "update_mask"},
		{"state path", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("credential_revision")}, connect.CodeInvalidArgument, "update_mask"},
		{"bad label", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("label"), Label: ""}, connect.CodeInvalidArgument, "label"},
		{"bad base url", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("base_url"), BaseUrl: "https://u:p@x.example"}, connect.CodeInvalidArgument, "base_url"},
		{"zero concurrency", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("max_concurrency")}, connect.CodeInvalidArgument, "max_concurrency"},
		{"huge concurrency", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("max_concurrency"), MaxConcurrency: 10001}, connect.CodeInvalidArgument, "max_concurrency"},
		{"bad credential", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("credential"), Credential: "short"}, connect.CodeInvalidArgument, "credential"},
		{"taken label", &weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("label"), Label: "taken"}, connect.CodeAlreadyExists, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := update(tc.req)
			ce := wantCode(t, err, tc.code)
			if tc.msg != "" && !strings.HasPrefix(ce.Message(), tc.msg+":") {
				t.Errorf("message %q does not name %s", ce.Message(), tc.msg)
			}
		})
	}
	// A rejected update changed nothing, not even updated_at.
	if got := e.getAccount(a.Id); got.Label != "after" || got.Priority != -1 || !got.UpdatedAt.AsTime().Equal(epoch.Add(time.Minute)) {
		t.Errorf("after rejected updates: %v", got)
	}

	// The credential: new revision and hint, and Acquire hands out the new one.
	e.pause("taken")
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.Credential != oldCred {
		t.Fatal("Acquire before rotation did not return the first credential")
	}
	newCred := oauthToken()
	e.secrets.add(newCred)
	got, err = update(&weirv1.UpdateAccountRequest{Id: a.Id, UpdateMask: mask("credential"), Credential: newCred})
	if err != nil {
		t.Fatalf("credential update: %v", err)
	}
	if got.CredentialRevision != 2 || got.CredentialHint != "sk-ant-oat01-…"+newCred[len(newCred)-4:] {
		t.Errorf("revision %d hint %q", got.CredentialRevision, got.CredentialHint)
	}
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	if l.AccountId != a.Id || l.Credential != newCred || l.BaseUrl != "https://proxy.example.com" {
		t.Errorf("lease after rotation: account %s, new credential %v, base %q", l.AccountLabel, l.Credential == newCred, l.BaseUrl)
	}
}

// TestUpdateCredentialClearsVerdicts: a new credential wipes the old one's
// invalid_credential cooldown and broken state.
func TestUpdateCredentialClearsVerdicts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 3})
	// Three concurrent requests, all rejected: broken.
	var leases []*weirv1.Lease
	for range 3 {
		leases = append(leases, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}))
	}
	for _, l := range leases {
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401, ErrorType: "authentication_error"})
	}
	got := e.getAccount(a.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN || got.BrokenReason == "" ||
		got.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL {
		t.Fatalf("after 3 rejections: %v", got)
	}
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)

	newCred := apiKey()
	e.secrets.add(newCred)
	resp, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: a.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}}, Credential: newCred,
	}))
	if err != nil {
		t.Fatal(err)
	}
	got = resp.Msg.Account
	requireAbsent(t, "UpdateAccount", resp.Msg, newCred)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil || got.BrokenReason != "" || got.CredentialRevision != 2 {
		t.Errorf("after a new credential: %v", got)
	}
	if row := e.accountRow(a.Id); row.AuthFailures != 0 || row.BrokenAt != nil {
		t.Errorf("auth_failures %d broken_at %v", row.AuthFailures, row.BrokenAt)
	}
	if e.cooldownRow(a.Id) != nil {
		t.Error("the invalid_credential cooldown row survived the new credential")
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.Credential != newCred {
		t.Error("Acquire did not return the new credential")
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "a", priority: 10})
	b, _ := e.createAccount(acct{label: "b"})

	if got := e.pause("a"); got.State != weirv1.AccountState_ACCOUNT_STATE_PAUSED {
		t.Errorf("paused state %v", got.State)
	}
	// a outranks b on priority, yet every lease goes to b.
	for range 3 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		if l.AccountId != b.Id {
			t.Fatalf("paused account leased")
		}
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})
	}
	// Pausing twice is harmless.
	e.pause(a.Id)

	// Resume clears cooldown and broken state.
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429})
	if _, err := e.pool.Exec(t.Context(),
		`UPDATE accounts SET broken_at = $2, broken_reason = 'test', auth_failures = 5 WHERE id = $1`, a.Id, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(t.Context(),
		`INSERT INTO cooldowns VALUES ($1, 'invalid_credential', false, $2, $3, '{"class":"auth_error"}')`,
		a.Id, e.clock.Now().Add(time.Hour), e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if got := e.getAccount("a"); got.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN {
		t.Fatalf("state %v", got.State)
	}
	for _, id := range []string{a.Id, b.Id} {
		got := e.resume(id)
		if got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil || got.BrokenReason != "" {
			t.Errorf("resumed %s: %v", got.Label, got)
		}
		if row := e.accountRow(id); row.AuthFailures != 0 || row.BrokenAt != nil || row.Paused {
			t.Errorf("resumed row %s: %+v", row.Label, row)
		}
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != a.Id {
		t.Errorf("after resume the priority account should win, got %s", l.AccountLabel)
	}
}

func TestDeleteAccountCascades(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "doomed"})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess-1"})
	l2 := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(l2.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429})
	if _, err := reportOne(t.Context(), e.dp.leases, &weirv1.RouteEvent{
		RequestId: "r1", KeyId: key.Id, AccountId: a.Id, Status: 200,
	}); err != nil {
		t.Fatal(err)
	}

	if _, err := e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: "doomed"})); err != nil {
		t.Fatalf("DeleteAccount: %v", err)
	}
	_, err := e.admin.accounts.GetAccount(t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: a.Id}))
	wantCode(t, err, connect.CodeNotFound)
	for table, n := range map[string]int{
		"leases":           e.count(`SELECT count(*) FROM leases WHERE account_id = $1`, a.Id),
		"cooldowns":        e.count(`SELECT count(*) FROM cooldowns WHERE account_id = $1`, a.Id),
		"session_bindings": e.count(`SELECT count(*) FROM session_bindings WHERE account_id = $1`, a.Id),
	} {
		if n != 0 {
			t.Errorf("%s: %d rows outlived the account", table, n)
		}
	}
	// The route event stays, detached from the account.
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'r1' AND account_id IS NULL`); n != 1 {
		t.Errorf("route event: %d detached rows", n)
	}
	_, err = e.dp.leases.Release(t.Context(), connect.NewRequest(&weirv1.ReleaseRequest{
		LeaseId: l.Id, Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS},
	}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: a.Id}))
	wantCode(t, err, connect.CodeNotFound)
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess-1"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED)
}
