package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Metered accounts (API keys) spent knowingly, end to end: a request that
// moves to a pay-per-token key because no subscription can serve is a
// spill, on its route event and in the workers' metric; metered_accounts
// decides whether the key is used last or never, globally or per key.

// setMetered changes the global metered_accounts setting and waits until
// the worker dropped what it reused under the old one.
func (e *env) setMetered(m weirv1.MeteredAccounts) {
	e.t.Helper()
	e.change(func() {
		if _, err := e.settings.UpdateSettings(e.t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
			Settings:   &weirv1.Settings{MeteredAccounts: m},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"metered_accounts"}},
		})); err != nil {
			e.t.Fatalf("set metered_accounts: %v", err)
		}
	})
}

// setKeyMetered sets the test key's own metered_accounts (UNSPECIFIED:
// follow the global setting).
func (e *env) setKeyMetered(m weirv1.MeteredAccounts) {
	e.t.Helper()
	e.change(func() {
		if _, err := e.keys.UpdateKey(e.t.Context(), connect.NewRequest(&weirv1.UpdateKeyRequest{Id: e.keyID, MeteredAccounts: m,
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"metered_accounts"}}})); err != nil {
			e.t.Fatalf("set the key's metered_accounts: %v", err)
		}
	})
}

// servedBy checks a request succeeded on account want, and whether its
// route event says it spilled to a metered account.
func servedBy(t *testing.T, e *env, r response, want string, spilled bool) *weirv1.RouteEvent {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200 from %s: %s", r.status, want, r.body)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if got := e.labels[ev.AccountId]; got != want || ev.SpilledToMetered != spilled {
		t.Fatalf("served by %s, spilled %v; want %s, spilled %v", got, ev.SpilledToMetered, want, spilled)
	}
	return ev
}

func spillCount(e *env, provider, surface string) float64 {
	return e.workerMetric("weir_dataplane_metered_spills_total", map[string]string{"provider": provider, "surface": surface})
}

// TestMeteredSpillRecorded: the ChatGPT login out of quota, Codex traffic
// moves to the OpenAI key: not silently. The route event and the spilled
// attempt say so (the login's attempt does not), the metric counts each
// request, and the spills are listed apart. A Chat Completions request on
// the same key is no spill: no subscription serves that surface.
func TestMeteredSpillRecorded(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	chatgpt := spentCodex("chatgpt", 2*time.Hour)
	chatgpt.priority = 10
	e := setup(t, options{virtual: v, accounts: []account{chatgpt, {label: "oai", provider: "openai"}}})

	ev := servedBy(t, e, e.responses(false), "oai", true)
	if recs := ev.AttemptRecords; len(recs) != 2 || e.labels[recs[0].AccountId] != "chatgpt" || recs[0].SpilledToMetered ||
		e.labels[recs[1].AccountId] != "oai" || !recs[1].SpilledToMetered {
		t.Errorf("attempt records %v, want chatgpt's 429 then a spill to oai", recs)
	}
	servedBy(t, e, e.responses(true), "oai", true)
	if n := spillCount(e, "openai", "responses"); n != 2 {
		t.Errorf("weir_dataplane_metered_spills_total{openai,responses} = %v, want 2", n)
	}
	servedBy(t, e, e.chat(false), "oai", false)
	if n := spillCount(e, "openai", "chat_completions"); n != 0 {
		t.Errorf("chat completions counted %v spills", n)
	}

	res, err := e.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{SpilledOnly: true}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.Events) != 2 {
		t.Errorf("%d spilled route events, want the 2 Responses requests", len(res.Msg.Events))
	}
	for _, ev := range res.Msg.Events {
		if !ev.SpilledToMetered || ev.Surface != "responses" {
			t.Errorf("listed as spilled: %v", ev)
		}
	}
}

// TestMeteredLastResortAndNever: the key ranks first by priority in the
// normal mode; under last_resort the subscription serves, and the key
// only when the subscription cannot (a spill); under never the key is not
// used for Claude Code's surface at all, the refusal naming the setting,
// while a key's own setting wins over the global one.
func TestMeteredLastResortAndNever(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, accounts: []account{
		{label: "key", priority: 10},
		{label: "max", oauth: true},
	}})
	servedBy(t, e, e.post(false), "key", false) // normal: priority decides

	e.setMetered(weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT)
	for range 2 {
		servedBy(t, e, e.post(false), "max", false)
	}
	e.change(func() {
		if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: "max"})); err != nil {
			t.Fatal(err)
		}
	})
	servedBy(t, e, e.post(false), "key", true)
	if n := spillCount(e, "anthropic", "messages"); n != 1 {
		t.Errorf("weir_dataplane_metered_spills_total{anthropic,messages} = %v, want 1", n)
	}

	e.setMetered(weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER)
	n := len(e.attempts())
	r := e.post(false)
	got := weirError(t, r, http.StatusServiceUnavailable, "api_error")
	if !strings.Contains(got.Error.Message, "metered_accounts=never, the pool's setting") || r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("never: %q X-Should-Retry %q, want a final refusal naming the setting", got.Error.Message, r.header.Get("X-Should-Retry"))
	}
	if len(e.attempts()) != n {
		t.Errorf("never: the key was tried: %v", e.attempts()[n:])
	}

	// The key's own setting wins over the global never, and once cleared
	// the global one applies again.
	e.setKeyMetered(weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL)
	servedBy(t, e, e.post(false), "key", true)
	e.setKeyMetered(weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED)
	if r := e.post(false); r.status != http.StatusServiceUnavailable {
		t.Errorf("the key following never again: %d %s", r.status, r.body)
	}

	// And the other way round: a never key under the global normal.
	e.setMetered(weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL)
	servedBy(t, e, e.post(false), "key", true)
	e.setKeyMetered(weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER)
	got = weirError(t, e.post(false), http.StatusServiceUnavailable, "api_error")
	if !strings.Contains(got.Error.Message, "metered_accounts=never, this key's setting") {
		t.Errorf("a never key: %q, want it to name the key's setting", got.Error.Message)
	}
}
