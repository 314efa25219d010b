package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// unreachableURL is a real base URL whose host does not exist: the worker
// dials it for real and the lookup fails at once, online or not.
const unreachableURL = "https://api.example.invalid"

const unreachableCause = "every account's upstream is unreachable: dns: no such host for api.example.invalid"

// TestUnreachablePoolAnswersAtItsShortBudget: a pool whose only account
// cannot be reached is held for unreachable_hold (30 s on the virtual
// clock), not the 20-minute capacity hold, and answered with a 503 in the
// client's wire format that names the cause; the route event, the
// attempt records and the account say why.
func TestUnreachablePoolAnswersAtItsShortBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		provider string
		send     func(*env) response
		errType  func(body []byte) string
	}{
		{"messages", "", func(e *env) response { return e.post(false) }, func(b []byte) string {
			var v struct {
				Type  string `json:"type"`
				Error struct{ Type, Message string }
			}
			_ = json.Unmarshal(b, &v)
			return v.Type + "/" + v.Error.Type + ": " + v.Error.Message
		}},
		{"responses", "openai", func(e *env) response { return e.responses(false) }, func(b []byte) string {
			var v struct {
				Error struct{ Type, Message string }
			}
			_ = json.Unmarshal(b, &v)
			return "error/" + v.Error.Type + ": " + v.Error.Message
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := virtualClock()
			e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
				{label: "gone", provider: tc.provider, baseURL: unreachableURL + map[string]string{"openai": "/v1"}[tc.provider]},
			}})
			start := v.Now()
			r := tc.send(e)
			elapsed := v.Now().Sub(start)
			if r.status != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503: %s", r.status, r.body)
			}
			wantType := map[string]string{"": "error/api_error", "openai": "error/server_error"}[tc.provider]
			if got := tc.errType(r.body); got != wantType+": weir: "+unreachableCause {
				t.Errorf("body %q, want %q", got, wantType+": weir: "+unreachableCause)
			}
			if r.header.Get("X-Should-Retry") != "false" || r.header.Get("Retry-After") != "" {
				t.Errorf("X-Should-Retry %q, Retry-After %q: want false and none", r.header.Get("X-Should-Retry"), r.header.Get("Retry-After"))
			}
			if elapsed < 30*time.Second || elapsed > 31*time.Second {
				t.Errorf("answered after %v (virtual), want the 30 s unreachable hold", elapsed)
			}
			if n := len(e.sim.Attempts()); n != 0 {
				t.Errorf("the simulator saw %d attempts", n)
			}

			ev := heldFor(t, e, r)
			if ev.Status != http.StatusServiceUnavailable || ev.Held.AsDuration() < 29*time.Second || ev.Held.AsDuration() > 31*time.Second {
				t.Errorf("route event: status %d, held %v", ev.Status, ev.Held.AsDuration())
			}
			var attempts, holds int
			for _, a := range ev.AttemptRecords {
				switch {
				case a.AccountId != "":
					attempts++
					if a.Class != weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR || a.TransportCause != weirv1.TransportCause_TRANSPORT_CAUSE_DNS {
						t.Errorf("attempt %v: want a transport error caused by dns", a)
					}
				case strings.Contains(a.HoldReason, unreachableCause):
					holds++
				}
			}
			// One attempt per transport cooldown (10 s): at 0, 10, 20, 30 s.
			if attempts != 4 || holds < 3 {
				t.Errorf("%d attempts, %d holds naming the cause; want 4 attempts (one per 10 s cooldown) and the holds: %v", attempts, holds, ev.AttemptRecords)
			}

			acct, err := e.accounts.GetAccount(t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: e.ids["gone"]}))
			if err != nil {
				t.Fatal(err)
			}
			u := acct.Msg.Account.Unreachable
			if u == nil || u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_DNS || u.Error != "no such host" || u.Host != "api.example.invalid" ||
				u.Attempts != 4 || !u.Since.AsTime().Equal(start) {
				t.Errorf("account's run %v, want dns no such host since the start, 4 attempts", u)
			}
		})
	}
}

// TestUnreachableAccountBesideReachableOne: a pool with one reachable
// account still serves, at once, whatever its unreachable account does.
func TestUnreachableAccountBesideReachableOne(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "gone", baseURL: unreachableURL, priority: 10}, {label: "ok"},
	}})
	for i := range 3 {
		start := v.Now()
		r := e.post(false)
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200: %s", i, r.status, r.body)
		}
		if held := heldFor(t, e, r).Held.AsDuration(); held != 0 || v.Now().Sub(start) > time.Second {
			t.Fatalf("request %d held %v, answered after %v", i, held, v.Now().Sub(start))
		}
	}
	if got := e.attempts(); len(got) != 3 {
		t.Errorf("simulator attempts %v, want the 3 requests on ok", got)
	}
}

// TestUnreachableBesideOverloadedHoldsLonger: a mix of an unreachable
// account and a merely overloaded one keeps the capacity hold: the
// request outlasts the 30 s unreachable hold and is served when the
// overload passes.
func TestUnreachableBesideOverloadedHoldsLonger(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "gone", baseURL: unreachableURL},
		{label: "busy", faults: []sim.Fault{{Kind: sim.FaultOverloaded, For: sim.Duration(2 * time.Minute)}}},
	}})
	start := v.Now()
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d after %v, want 200 once busy answers: %s", r.status, v.Now().Sub(start), r.body)
	}
	if elapsed := v.Now().Sub(start); elapsed < 2*time.Minute {
		t.Errorf("served after %v, before the overload passed", elapsed)
	}
	for _, a := range heldFor(t, e, r).AttemptRecords {
		if strings.Contains(a.HoldReason, "unreachable") {
			t.Fatalf("a hold called the pool unreachable: %v", a)
		}
	}
}
