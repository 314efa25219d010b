package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Metered accounts (API keys) against subscriptions (OAuth logins): how
// metered_accounts orders and filters routing, and which leases are
// spills.

const (
	meteredNormal     = weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL
	meteredLastResort = weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT
	meteredNeverMode  = weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER
)

// oauth makes a candidate a subscription.
func oauth() func(*Candidate) {
	return func(x *Candidate) { x.Account.AuthKind = weirv1.AuthKind_AUTH_KIND_OAUTH }
}

// spilled lists the accounts of order that a lease would mark as spills.
func spilled(cands, order []Candidate, req RouteRequest) string {
	var out []Candidate
	for i, x := range order {
		if IsMetered(x.Account) && i >= SpillFrom(cands, order, req) {
			out = append(out, x)
		}
	}
	return labelsOf(out)
}

// TestMeteredRouting: the order Route() gives under each setting, and the
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
		cands   []Candidate
		session string
		exclude string
		order   string // "" with none: no account
		spills  string
		none    string // part of the NoAccount message
		reason  weirv1.NoAccountReason
		final   bool
	}{
		{name: "normal: priority decides, no spill while a subscription can serve", mode: meteredNormal, surface: messages,
			cands: []Candidate{c("key", prio(5)), c("max", oauth())}, order: "key,max"},
		{name: "unspecified is normal", surface: messages,
			cands: []Candidate{c("key", prio(5)), c("max", oauth())}, order: "key,max"},
		{name: "normal: the subscription cooling, the key is a spill", mode: meteredNormal, surface: messages,
			cands: []Candidate{c("key"), c("max", oauth(), cooling(time.Hour, true))}, order: "key", spills: "key"},
		{name: "normal: the subscription tried, the key is a spill", mode: meteredNormal, surface: messages, exclude: "max",
			cands: []Candidate{c("key"), c("max", oauth())}, order: "key", spills: "key"},
		{name: "no subscription in the pool: no spill", mode: meteredNormal, surface: messages,
			cands: []Candidate{c("key"), c("key2")}, order: "key,key2"},
		{name: "last_resort: subscriptions first over priority and the session", mode: meteredLastResort, surface: messages, session: "key",
			cands: []Candidate{c("key", prio(9)), c("max", oauth()), c("max2", oauth(), live(3))}, order: "max,max2,key", spills: "key"},
		{name: "last_resort: the key only when no subscription can serve", mode: meteredLastResort, surface: messages,
			cands: []Candidate{c("key"), c("max", oauth(), cooling(time.Hour, true)), c("max2", oauth(), paused())}, order: "key", spills: "key"},
		{name: "last_resort on responses: codex first, openai after", mode: meteredLastResort, surface: responses,
			cands: []Candidate{c("oai", openai(), prio(3)), c("chatgpt", codex(), oauth())}, order: "chatgpt,oai", spills: "oai"},
		{name: "never: the keys are left out", mode: meteredNeverMode, surface: messages,
			cands: []Candidate{c("key"), c("max", oauth())}, order: "max"},
		{name: "never: subscriptions cooling, no key takes over", mode: meteredNeverMode, surface: responses,
			cands:  []Candidate{c("oai", openai()), c("chatgpt", codex(), oauth(), cooling(time.Hour, true))},
			none:   "1 metered accounts are not used where a subscription can serve (metered_accounts=never, the pool's setting)",
			reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING},
		{name: "never with no subscription at all: refused for good", mode: meteredNeverMode, surface: messages,
			cands:  []Candidate{c("key"), c("key2")},
			none:   "no subscription account in the pool serves this model; 2 metered accounts are not used where a subscription can serve (metered_accounts=never",
			reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED, final: true},
		{name: "never leaves chat completions alone", mode: meteredNeverMode, surface: chat,
			cands: []Candidate{c("oai", openai()), c("chatgpt", codex(), oauth())}, order: "oai"},
		{name: "last_resort leaves chat completions alone, and it has no spills", mode: meteredLastResort, surface: chat,
			cands: []Candidate{c("oai", openai(), usedAt(-time.Second)), c("oai2", openai())}, order: "oai2,oai"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RouteRequest{Model: "m", Surface: tc.surface, Metered: tc.mode, Exclude: map[uuid.UUID]bool{}}
			if tc.session != "" {
				req.SessionAccount = c(tc.session).Account.ID
			}
			if tc.exclude != "" {
				req.Exclude[c(tc.exclude).Account.ID] = true
			}
			order, none := Route(tc.cands, req, epoch)
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
	cands := []Candidate{c("oai", openai()), c("chatgpt", codex(), oauth(), quotaCooling(2*time.Hour, 2*time.Hour, 300, "limit"))}
	req := RouteRequest{Model: "m", Surface: weirv1.Surface_SURFACE_RESPONSES, Metered: meteredNeverMode}
	if qb := QuotaBlock(cands, req, epoch); qb == nil || qb.Accounts != 1 || qb.LastUpstreamError != "limit" {
		t.Errorf("never: quota block %v, want chatgpt's", qb)
	}
	req.Metered = meteredNormal
	if qb := QuotaBlock(cands, req, epoch); qb != nil {
		t.Errorf("normal: quota block %v, want none (the key can serve)", qb)
	}
}

// TestMeteredKeyOverridesGlobal: a key's own setting wins; without one the
// global setting applies, and the refusal says whose it is.
