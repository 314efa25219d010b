package controlplane

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Metered accounts (API keys) against subscriptions (OAuth logins), pure:
// how metered_accounts orders and filters routing, and which leases are
// spills.

const (
	meteredNormal     = weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL
	meteredLastResort = weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT
	meteredNeverMode  = weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER
)

// oauth makes a candidate a subscription.
func oauth() func(*candidate) { return func(x *candidate) { x.account.AuthKind = "oauth" } }

// spilled lists the accounts of order that a lease would mark as spills.
func spilled(cands, order []candidate, req routeRequest) string {
	var out []candidate
	for i, x := range order {
		if isMetered(x.account) && i >= spillFrom(cands, order, req) {
			out = append(out, x)
		}
	}
	return labelsOf(out)
}

// TestMeteredRouting: the order route() gives under each setting, and the
// spills among it. last_resort puts every subscription first, whatever
// priority or session says; never leaves metered accounts out where a
// subscription can serve, and says so by the setting's name; Chat
// Completions has no subscription, so neither setting touches it, and no
// lease there is a spill.
func TestMeteredRouting(t *testing.T) {
	t.Parallel()
	const (
		messages  = weirv1.Surface_SURFACE_MESSAGES
		responses = weirv1.Surface_SURFACE_RESPONSES
		chat      = weirv1.Surface_SURFACE_CHAT_COMPLETIONS
	)
	for _, tc := range []struct {
		name    string
		mode    weirv1.MeteredAccounts
		surface weirv1.Surface
		cands   []candidate
		session string
		exclude string
		order   string // "" with none: no account
		spills  string
		none    string // part of the NoAccount message
		reason  weirv1.NoAccountReason
		final   bool
	}{
		{name: "normal: priority decides, no spill while a subscription can serve", mode: meteredNormal, surface: messages,
			cands: []candidate{c("key", prio(5)), c("max", oauth())}, order: "key,max"},
		{name: "unspecified is normal", surface: messages,
			cands: []candidate{c("key", prio(5)), c("max", oauth())}, order: "key,max"},
		{name: "normal: the subscription cooling, the key is a spill", mode: meteredNormal, surface: messages,
			cands: []candidate{c("key"), c("max", oauth(), cooling(time.Hour, true))}, order: "key", spills: "key"},
		{name: "normal: the subscription tried, the key is a spill", mode: meteredNormal, surface: messages, exclude: "max",
			cands: []candidate{c("key"), c("max", oauth())}, order: "key", spills: "key"},
		{name: "no subscription in the pool: no spill", mode: meteredNormal, surface: messages,
			cands: []candidate{c("key"), c("key2")}, order: "key,key2"},
		{name: "last_resort: subscriptions first over priority and the session", mode: meteredLastResort, surface: messages, session: "key",
			cands: []candidate{c("key", prio(9)), c("max", oauth()), c("max2", oauth(), live(3))}, order: "max,max2,key", spills: "key"},
		{name: "last_resort: the key only when no subscription can serve", mode: meteredLastResort, surface: messages,
			cands: []candidate{c("key"), c("max", oauth(), cooling(time.Hour, true)), c("max2", oauth(), paused())}, order: "key", spills: "key"},
		{name: "last_resort on responses: codex first, openai after", mode: meteredLastResort, surface: responses,
			cands: []candidate{c("oai", openai(), prio(3)), c("chatgpt", codex(), oauth())}, order: "chatgpt,oai", spills: "oai"},
		{name: "never: the keys are left out", mode: meteredNeverMode, surface: messages,
			cands: []candidate{c("key"), c("max", oauth())}, order: "max"},
		{name: "never: subscriptions cooling, no key takes over", mode: meteredNeverMode, surface: responses,
			cands:  []candidate{c("oai", openai()), c("chatgpt", codex(), oauth(), cooling(time.Hour, true))},
			none:   "1 metered accounts are not used where a subscription can serve (metered_accounts=never, the pool's setting)",
			reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING},
		{name: "never with no subscription at all: refused for good", mode: meteredNeverMode, surface: messages,
			cands:  []candidate{c("key"), c("key2")},
			none:   "no subscription account in the pool serves this model; 2 metered accounts are not used where a subscription can serve (metered_accounts=never",
			reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED, final: true},
		{name: "never leaves chat completions alone", mode: meteredNeverMode, surface: chat,
			cands: []candidate{c("oai", openai()), c("chatgpt", codex(), oauth())}, order: "oai"},
		{name: "last_resort leaves chat completions alone, and it has no spills", mode: meteredLastResort, surface: chat,
			cands: []candidate{c("oai", openai(), usedAt(-time.Second)), c("oai2", openai())}, order: "oai2,oai"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := routeRequest{model: "m", surface: tc.surface, metered: tc.mode, exclude: map[uuid.UUID]bool{}}
			if tc.session != "" {
				req.sessionAccount = c(tc.session).account.ID
			}
			if tc.exclude != "" {
				req.exclude[c(tc.exclude).account.ID] = true
			}
			order, none := route(tc.cands, req, epoch)
			if tc.order == "" {
				if none == nil || !strings.Contains(none.Message, tc.none) || none.Reason != tc.reason || none.Permanent != tc.final {
					t.Fatalf("order %q none %v, want %v (permanent %v) saying %q", labelsOf(order), none, tc.reason, tc.final, tc.none)
				}
				return
			}
			if none != nil || labelsOf(order) != tc.order {
				t.Fatalf("order %q none %v, want %q", labelsOf(order), none, tc.order)
			}
			if got := spilled(tc.cands, order, req); got != tc.spills {
				t.Errorf("spills %q, want %q", got, tc.spills)
			}
		})
	}
}

// TestMeteredQuotaBlock: under never, a pool whose subscriptions are out
// of quota is out of quota, whatever its withheld keys could do; under
// normal, the free key means it is not.
func TestMeteredQuotaBlock(t *testing.T) {
	t.Parallel()
	cands := []candidate{c("oai", openai()), c("chatgpt", codex(), oauth(), quotaCooling(2*time.Hour, 2*time.Hour, 300, "limit"))}
	req := routeRequest{model: "m", surface: weirv1.Surface_SURFACE_RESPONSES, metered: meteredNeverMode}
	if qb := quotaBlock(cands, req, epoch); qb == nil || qb.Accounts != 1 || qb.LastUpstreamError != "limit" {
		t.Errorf("never: quota block %v, want chatgpt's", qb)
	}
	req.metered = meteredNormal
	if qb := quotaBlock(cands, req, epoch); qb != nil {
		t.Errorf("normal: quota block %v, want none (the key can serve)", qb)
	}
}

// TestMeteredKeyOverridesGlobal: a key's own setting wins; without one the
// global setting applies, and the refusal says whose it is.
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
	_, none := route([]candidate{c("key")}, keyGrant{}.withMetered("never", "normal").route(routeRequest{model: "m"}), epoch)
	if none == nil || !strings.Contains(none.Message, "metered_accounts=never, this key's setting") {
		t.Errorf("refusal %v, want it to name the key's setting", none)
	}
}

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
