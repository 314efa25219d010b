package controlplane

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Metered accounts (API keys) against subscriptions (OAuth logins) on
// Postgres, and a key's own setting (policy/metered_test.go: how
// metered_accounts orders and filters routing, and which leases are
// spills).

const (
	meteredNormal     = weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL
	meteredLastResort = weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT
	meteredNeverMode  = weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER
)

// TestMeteredSettingAndKeys, on Postgres: the global setting is stored,
// served, audited and checked like the others; a key's own is stored,
// shown and cleared; Acquire follows the key's when it has one, else the
// global one, and marks a spill on the lease it grants.
func TestMeteredSettingAndKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if got := e.getSettings().MeteredAccounts; got != meteredNormal {
		t.Fatalf("default metered_accounts %v, want NORMAL", got)
	}
	max, _ := e.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken(), priority: 1})
	e.createAccount(acct{label: "key"})
	_, global := e.createKey("follows")
	own, ownHash := e.createKey("own")
	req := func(keyHash string) *weirv1.AcquireRequest {
		return &weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5", Surface: weirv1.Surface_SURFACE_MESSAGES}
	}

	// Normal: the subscription (priority 1) serves; with it paused, the
	// key does, as a spill.
	if l := e.mustLease(req(global)); l.AccountLabel != "max" || l.SpilledToMetered {
		t.Errorf("normal: lease on %s spilled %v, want max, no spill", l.AccountLabel, l.SpilledToMetered)
	}
	e.pause(max.Id)
	if l := e.mustLease(req(global)); l.AccountLabel != "key" || !l.SpilledToMetered {
		t.Errorf("normal, max paused: lease on %s spilled %v, want a spill to key", l.AccountLabel, l.SpilledToMetered)
	}

	// Never, globally: refused, naming the setting, for both keys until
	// one says otherwise.
	st, err := e.updateSettings(&weirv1.Settings{MeteredAccounts: meteredNeverMode}, "metered_accounts")
	if err != nil || st.MeteredAccounts != meteredNeverMode {
		t.Fatalf("set never: %v %v", st, err)
	}
	for _, h := range []string{global, ownHash} {
		none := e.mustNoAccount(req(h), weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)
		if !strings.Contains(none.Message, "metered_accounts=never, the pool's setting") {
			t.Errorf("never: %q, want it to name the setting", none.Message)
		}
	}
	k, err := e.updateKey(&weirv1.UpdateKeyRequest{Id: own.Id, MeteredAccounts: meteredNormal}, "metered_accounts")
	if err != nil || k.MeteredAccounts != meteredNormal {
		t.Fatalf("key normal: %v %v", k, err)
	}
	if l := e.mustLease(req(ownHash)); l.AccountLabel != "key" || !l.SpilledToMetered {
		t.Errorf("the key's normal over the global never: lease on %s spilled %v", l.AccountLabel, l.SpilledToMetered)
	}
	e.mustNoAccount(req(global), weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)
	// Cleared, the key follows the global setting again.
	if k, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: own.Id}, "metered_accounts"); err != nil || k.MeteredAccounts != weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
		t.Fatalf("clear: %v %v", k, err)
	}
	e.mustNoAccount(req(ownHash), weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)

	// A key created with its own setting, and values refused.
	resp, err := e.admin.keys.CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "last", MeteredAccounts: meteredLastResort}))
	if err != nil || resp.Msg.Key.MeteredAccounts != meteredLastResort {
		t.Fatalf("create with last_resort: %v %v", resp, err)
	}
	e.secrets.add(resp.Msg.Secret)
	_, err = e.admin.keys.CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "bad", MeteredAccounts: 9}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.updateSettings(&weirv1.Settings{MeteredAccounts: 9}, "metered_accounts")
	if ce := wantCode(t, err, connect.CodeInvalidArgument); ce.Message() != "settings.metered_accounts: unknown value 9; want normal, last_resort or never" {
		t.Errorf("refusal %q", ce.Message())
	}

	// Audited like every setting.
	changes, err := e.settingsClient(e.cfg.AdminToken).ListSettingChanges(t.Context(), connect.NewRequest(&weirv1.ListSettingChangesRequest{}))
	if err != nil || len(changes.Msg.Changes) != 1 || changes.Msg.Changes[0].Name != "metered_accounts" ||
		changes.Msg.Changes[0].OldValue != "" || changes.Msg.Changes[0].NewValue != "never" {
		t.Errorf("setting changes %v %v, want one: metered_accounts to never", changes, err)
	}
}

// TestMeteredKeyOverridesGlobal: a key's own setting wins over the global
// one, and a refusal it causes names the key's setting.
func TestMeteredKeyOverridesGlobal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		own, global string
		want        weirv1.MeteredAccounts
		byKey       bool
	}{
		{"", "", weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED, false},
		{"", "never", meteredNeverMode, false},
		{"normal", "never", meteredNormal, true},
		{"last_resort", "", meteredLastResort, true},
	} {
		k := keyGrant{}.withMetered(tc.own, tc.global)
		if k.metered != tc.want || k.byKey != tc.byKey {
			t.Errorf("own %q global %q: %v by key %v, want %v %v", tc.own, tc.global, k.metered, k.byKey, tc.want, tc.byKey)
		}
	}
	metered := policy.Candidate{Account: policy.Account{ID: uuid.NewSHA1(uuid.NameSpaceOID, []byte("key")), Label: "key",
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, MaxConcurrency: 4}}
	_, none := policy.Route([]policy.Candidate{metered}, keyGrant{}.withMetered("never", "normal").route(policy.RouteRequest{Model: "m"}), epoch)
	if none == nil || !strings.Contains(none.Message, "metered_accounts=never, this key's setting") {
		t.Errorf("refusal %v, want it to name the key's setting", none)
	}
}
