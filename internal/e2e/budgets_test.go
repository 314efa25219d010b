package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Budgets end to end: real workers, the simulator's token counts, the
// control plane's ledger.

// tokensOf is what one request of body costs in tokens, as weir counted
// it: the route event's usage.
func (e *env) tokensOf(requestID string) int64 {
	e.t.Helper()
	ev := e.routeEvent(requestID)
	u := ev.GetUsage()
	return u.GetInputTokens() + u.GetOutputTokens() + u.GetCacheReadTokens() + u.GetCacheCreationTokens()
}

// budgetRefusal checks a budget refusal in the Messages format and
// returns its message.
func budgetRefusal(t *testing.T, r response) string {
	t.Helper()
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type    string         `json:"type"`
			Message string         `json:"message"`
			Budget  map[string]any `json:"budget"`
		} `json:"error"`
	}
	if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &body) != nil || body.Error.Type != "rate_limit_error" ||
		body.Error.Budget == nil || r.header.Get("X-Should-Retry") != "false" || r.header.Get("Retry-After") != "" {
		t.Fatalf("want a final 429 naming the budget, got %d %s %v", r.status, r.body, r.header)
	}
	return body.Error.Message
}

// TestTeamBudgetAcrossWorkers: two keys of one team, each on its own
// worker, spend the team's daily budget in turns; the team is refused
// within one request per worker of the budget, on both workers, with a
// final 429 naming the team and its reset.
func TestTeamBudgetAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "a", maxConc: 8}}})
	ctx := t.Context()
	workers := e.twoWorkers()
	// One request's size first, from an unbudgeted key.
	probe := e.post(false)
	if probe.status != 200 {
		t.Fatalf("probe: %d %s", probe.status, probe.body)
	}
	per := int64(0)
	eventually(t, "the probe's route event", func() bool {
		ev, err := e.routes.GetRouteEvent(ctx, connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: probe.header.Get("Weir-Request-Id")}))
		if err == nil && ev.Msg.Event.GetUsage() != nil {
			per = e.tokensOf(probe.header.Get("Weir-Request-Id"))
		}
		return per > 0
	})
	budget := 10*per + per/2
	if _, err := e.keys.CreateTeam(ctx, connect.NewRequest(&weirv1.CreateTeamRequest{Name: "platform",
		Budgets: []*weirv1.BudgetLimit{{Unit: weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, Period: weirv1.BudgetPeriod_BUDGET_PERIOD_DAY, Amount: float64(budget)}}})); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 2)
	for i := range keys {
		keys[i] = e.restrictedKey(&weirv1.CreateKeyRequest{Team: "platform"})
	}
	// A worker that refused never serves again; the other may still serve
	// the one request it let through before it heard of the spend.
	served, refusedAt := 0, -1
	refusedBy := [2]int{-1, -1}
	for i := range 30 {
		w := i % 2
		r := e.send(workers[w], keys[w], "/v1/messages", messagesBody(false))
		if r.status == http.StatusOK {
			if refusedBy[w] >= 0 {
				t.Fatalf("request %d served by worker %d after its refusal at %d", i, w, refusedBy[w])
			}
			served++
			continue
		}
		if refusedBy[w] < 0 {
			refusedBy[w] = i
		}
		msg := budgetRefusal(t, r)
		if !strings.Contains(msg, `team "platform"`) || !strings.Contains(msg, "resets at") {
			t.Errorf("refusal message %q", msg)
		}
		if refusedAt < 0 {
			refusedAt = i
		}
		if i > refusedAt+3 && refusedBy[0] >= 0 && refusedBy[1] >= 0 {
			break
		}
	}
	// Exact would be 11 (10.5 requests' worth); each worker may let one
	// more through that the other had not reported yet.
	if served < 11 || served > 13 {
		t.Errorf("%d requests served under a budget of %.1f requests, want 11 to 13", served, float64(budget)/float64(per))
	}
	t.Logf("served %d requests of %d tokens under a team budget of %d tokens", served, per, budget)
}

// TestSessionCap: a session over its cap is refused while another session
// of the same key goes on; on Responses the refusal is Codex's usage-limit
// form.
func TestSessionCap(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "a", maxConc: 8}, {label: "cx", provider: "codex", maxConc: 8}}})
	ctx := t.Context()
	probe := e.post(false)
	var per int64
	eventually(t, "the probe's route event", func() bool {
		ev, err := e.routes.GetRouteEvent(ctx, connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: probe.header.Get("Weir-Request-Id")}))
		if err == nil && ev.Msg.Event.GetUsage() != nil {
			per = e.tokensOf(probe.header.Get("Weir-Request-Id"))
		}
		return per > 0
	})
	key := e.restrictedKey(&weirv1.CreateKeyRequest{Budgets: []*weirv1.BudgetLimit{{Unit: weirv1.BudgetUnit_BUDGET_UNIT_TOKENS,
		Period: weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION, Amount: float64(3*per + per/2)}}})
	w := worker{e.client, e.dpSrv.URL}
	inSession := func(session string) response {
		return e.doWith(w.c, w.base, http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) {
			r.Header.Set("X-Api-Key", key)
			r.Header.Set("X-Claude-Code-Session-Id", session)
		})
	}
	for i := range 4 {
		if r := inSession("runaway"); r.status != 200 {
			t.Fatalf("request %d of the session, under its cap: %d %s", i, r.status, r.body)
		}
	}
	msg := budgetRefusal(t, inSession("runaway"))
	if !strings.Contains(msg, "session") {
		t.Errorf("refusal %q does not name the session cap", msg)
	}
	if r := inSession("careful"); r.status != 200 {
		t.Errorf("another session of the key: %d %s", r.status, r.body)
	}

	// A key over its day on Responses: Codex's usage-limit form, with the
	// reset, so that Codex stops and says when.
	day := e.restrictedKey(&weirv1.CreateKeyRequest{Budgets: []*weirv1.BudgetLimit{{Unit: weirv1.BudgetUnit_BUDGET_UNIT_USD,
		Period: weirv1.BudgetPeriod_BUDGET_PERIOD_DAY, Amount: 1e-9}}})
	first := e.send(w, day, "/v1/responses", responsesBody(false))
	if first.status != 200 {
		t.Fatalf("first Responses request: %d %s", first.status, first.body)
	}
	var r response
	eventually(t, "the day's budget refusal", func() bool {
		r = e.send(w, day, "/v1/responses", responsesBody(false))
		return r.status == http.StatusTooManyRequests
	})
	var body struct {
		Error struct {
			Type     string `json:"type"`
			Code     string `json:"code"`
			ResetsAt int64  `json:"resets_at"`
		} `json:"error"`
	}
	if json.Unmarshal(r.body, &body) != nil || body.Error.Type != "usage_limit_reached" || body.Error.Code != "budget_exceeded" ||
		body.Error.ResetsAt == 0 || r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("Responses over a day's budget: %d %s %v", r.status, r.body, r.header)
	}
}
