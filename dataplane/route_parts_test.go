package dataplane

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// wakeBound is how soon after capacity returns a held request must be
// served: the worker's own latencies (holdMinWait, recoverEvery, noneMin)
// are a quarter of it.
const wakeBound = time.Second

// partsCase is one scenario of route and step: a scripted pool and
// upstream, and what the client must get, when.
type partsCase struct {
	name     string
	accounts func(t0 time.Time) []*fakeAccount
	// faults are each account's upstream misbehaviour (sim).
	faults   func(t0 time.Time) map[string][]sim.Fault
	settings func(*weirv1.Settings)
	// script changes the pool over time.
	script func(r *rig)
	stream bool
	// cancelAt, when set, is when the client leaves.
	cancelAt time.Duration

	status int
	// in: the body holds each of these.
	in []string
	// from, to bound when the answer came (to 0: from exactly).
	from, to time.Duration
	// upstream are the accounts tried upstream, in order.
	upstream []string
	check    func(t *testing.T, r *rig, got answer)
}

func TestPartsRoute(t *testing.T) {
	t.Parallel()
	healthy := func(ids ...string) func(time.Time) []*fakeAccount {
		return func(time.Time) []*fakeAccount {
			var out []*fakeAccount
			for _, id := range ids {
				out = append(out, &fakeAccount{id: id})
			}
			return out
		}
	}
	for _, tc := range []partsCase{{
		name:     "served first try",
		accounts: healthy("a", "b"),
		status:   200, upstream: []string{"a"},
	}, {
		name: "a 429 fails over to another account",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", recoverAt: t0.Add(time.Hour)}, {id: "b"}}
		},
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultRateLimit}}}
		},
		status: 200, upstream: []string{"a", "b"},
	}, {
		name: "a 529 fails over to another account",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", recoverAt: t0.Add(time.Minute)}, {id: "b"}}
		},
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultOverloaded}}}
		},
		status: 200, upstream: []string{"a", "b"},
	}, {
		name:     "a 529 retries the same account after the decision's wait",
		accounts: func(time.Time) []*fakeAccount { return []*fakeAccount{{id: "a", retrySame: true}, {id: "b"}} },
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultOverloaded}}}
		},
		status: 200, upstream: []string{"a", "a"}, from: time.Second,
	}, {
		name:     "a burst 429 retries the same account",
		accounts: func(time.Time) []*fakeAccount { return []*fakeAccount{{id: "a", retrySame: true}, {id: "b"}} },
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultRateLimit}}}
		},
		status: 200, upstream: []string{"a", "a"}, from: time.Second,
	}, {
		name: "a same-account retry that fails again fails over",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", retrySame: true, recoverAt: t0.Add(time.Minute)}, {id: "b"}}
		},
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultOverloaded, Times: 2}}}
		},
		status: 200, upstream: []string{"a", "a", "b"}, from: time.Second,
	}, {
		name: "a storm known to end is held and served when it ends",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{
				{id: "a", coolUntil: t0.Add(30 * time.Second), coolReason: weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED},
				{id: "b", coolUntil: t0.Add(45 * time.Second), coolReason: weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED},
			}
		},
		status: 200, upstream: []string{"a"}, from: 30 * time.Second, to: 30*time.Second + wakeBound,
	}, {
		name: "a storm met upstream is held until the cooldowns it wrote end",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", recoverAt: t0.Add(40 * time.Second)}, {id: "b", recoverAt: t0.Add(25 * time.Second)}}
		},
		faults: func(t0 time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultOverloaded, Until: t0.Add(40 * time.Second)}},
				"b": {{Kind: sim.FaultOverloaded, Until: t0.Add(25 * time.Second)}}}
		},
		status: 200, upstream: []string{"a", "b", "b"}, from: 25 * time.Second, to: 25*time.Second + wakeBound,
	}, {
		name: "a cooldown lifted early is announced by WatchPool and wakes the hold",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", coolUntil: t0.Add(10 * time.Minute), coolReason: weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED}}
		},
		script: func(r *rig) {
			r.at(37*time.Second, func() {
				r.cp.set(func(f *fakeCP) { f.accounts[0].coolUntil = time.Time{} })
				r.cp.announce(&weirv1.WatchPoolResponse{AccountIds: []string{"a"}})
			})
		},
		status: 200, upstream: []string{"a"}, from: 37 * time.Second, to: 37*time.Second + wakeBound,
	}, {
		name:     "an open breaker is held until its next probe",
		accounts: healthy("a"),
		script: func(r *rig) {
			r.cp.set(func(f *fakeCP) { f.breakerUntil = r.start.Add(20 * time.Second) })
		},
		status: 200, upstream: []string{"a"}, from: 20 * time.Second, to: 20*time.Second + wakeBound,
	}, {
		name:     "a breaker that closes before its next probe is announced and wakes the hold",
		accounts: healthy("a"),
		script: func(r *rig) {
			r.cp.set(func(f *fakeCP) { f.breakerUntil = r.start.Add(time.Minute) })
			r.at(12*time.Second, func() {
				r.cp.set(func(f *fakeCP) { f.breakerUntil = time.Time{} })
				r.cp.announce(&weirv1.WatchPoolResponse{All: true})
			})
		},
		status: 200, upstream: []string{"a"}, from: 12 * time.Second, to: 12*time.Second + wakeBound,
	}, {
		name: "an account gated for the family is held until the gate ends",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", gateUntil: t0.Add(45 * time.Second)}}
		},
		status: 200, upstream: []string{"a"}, from: 45 * time.Second, to: 45*time.Second + wakeBound,
	}, {
		name: "a pool out of quota until a reset within the hold is held until it",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", spent: true, spentReset: t0.Add(3 * time.Minute)}}
		},
		status: 200, upstream: []string{"a"}, from: 3 * time.Minute, to: 3*time.Minute + wakeBound,
	}, {
		name: "the hold budget runs out: the last upstream failure, retryable",
		accounts: func(time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a"}, {id: "b"}}
		},
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultOverloaded, Times: -1}}, "b": {{Kind: sim.FaultOverloaded, Times: -1}}}
		},
		settings: func(st *weirv1.Settings) { st.CapacityHold = durationpb.New(time.Minute) },
		status:   529, in: []string{"overloaded_error"}, from: 55 * time.Second, to: time.Minute,
		check: func(t *testing.T, r *rig, got answer) {
			if got.header.Get("X-Should-Retry") == "false" {
				t.Errorf("X-Should-Retry false on a hold that ran out")
			}
		},
	}, {
		name: "the soonest recovery after the hold budget: weir's 529 at once, with its Retry-After",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", coolUntil: t0.Add(3 * time.Minute), coolReason: weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED}}
		},
		settings: func(st *weirv1.Settings) { st.CapacityHold = durationpb.New(time.Minute) },
		status:   529, in: []string{"weir: all 1 accounts are cooling down"},
		check: func(t *testing.T, r *rig, got answer) {
			if got.header.Get("Retry-After") != "180" {
				t.Errorf("Retry-After %q, want 180", got.header.Get("Retry-After"))
			}
		},
	}, {
		name: "a final usage limit: the 429 with its reset at once, no hold",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", spent: true, spentReset: t0.Add(3 * time.Hour)}, {id: "b", spent: true, spentReset: t0.Add(4 * time.Hour)}}
		},
		settings: func(st *weirv1.Settings) {
			st.QuotaResponseMode = weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT
		},
		status: 429, in: []string{"usage"},
		check: func(t *testing.T, r *rig, got answer) {
			if got.header.Get("X-Should-Retry") != "false" {
				t.Errorf("X-Should-Retry %q, want false", got.header.Get("X-Should-Retry"))
			}
			if got.header.Get("X-Codex-Primary-Reset-At") != strconvUnix(r.start.Add(3*time.Hour)) {
				t.Errorf("reset header %q, want the first reset", got.header.Get("X-Codex-Primary-Reset-At"))
			}
		},
	}, {
		name: "a pool out of quota past the hold in the retryable mode: a final 429 at once",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", spent: true, spentReset: t0.Add(3 * time.Hour)}}
		},
		status: 429, in: []string{"rate_limit_error", "out of usage quota"},
		check: func(t *testing.T, r *rig, got answer) {
			if got.header.Get("X-Should-Retry") != "false" || got.header.Get("Retry-After") != "10800" {
				t.Errorf("X-Should-Retry %q Retry-After %q", got.header.Get("X-Should-Retry"), got.header.Get("Retry-After"))
			}
		},
	}, {
		name: "only an operator can help: weir's final 503 at once",
		accounts: func(time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", disabled: true}}
		},
		status: 503, in: []string{"paused or broken"},
	}, {
		name: "every account unreachable: the unreachable hold ends in a 503 naming the cause",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", coolUntil: t0.Add(10 * time.Second), coolReason: weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT,
				recoverAt: t0.Add(20 * time.Second)}}
		},
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultDropConnection, Times: -1}}}
		},
		status: 503, in: []string{"unreachable"}, from: 10 * time.Second, to: 30 * time.Second,
	}, {
		name:     "the control plane down for a while: held, then served within the bound of its return",
		accounts: healthy("a"),
		script: func(r *rig) {
			r.verifyKey()
			r.cp.setDown(true)
			r.at(40*time.Second, func() { r.cp.setDown(false) })
		},
		status: 200, upstream: []string{"a"}, from: 40 * time.Second, to: 40*time.Second + wakeBound,
	}, {
		name:     "the control plane down past the hold budget: weir's retryable 503",
		accounts: healthy("a"),
		settings: func(st *weirv1.Settings) { st.CapacityHold = durationpb.New(time.Minute) },
		script: func(r *rig) {
			r.verifyKey()
			r.cp.setDown(true)
		},
		status: 503, in: []string{"control plane unavailable"}, from: 40 * time.Second, to: time.Minute,
		check: func(t *testing.T, r *rig, got answer) {
			if got.header.Get("Retry-After") != "2" || got.header.Get("X-Should-Retry") != "true" {
				t.Errorf("Retry-After %q X-Should-Retry %q", got.header.Get("Retry-After"), got.header.Get("X-Should-Retry"))
			}
		},
	}, {
		name: "the control plane gone between Acquire and Release: the worker fails over on its own, holds, and redelivers the Release",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", recoverAt: t0.Add(time.Hour)}, {id: "b"}}
		},
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultRateLimit, Times: -1}}}
		},
		script: func(r *rig) {
			r.cp.set(func(f *fakeCP) {
				f.afterLease = func(f *fakeCP, l *weirv1.Lease) {
					if l.AccountId == "a" {
						f.down, f.afterLease = true, nil
					}
				}
			})
			r.at(30*time.Second, func() { r.cp.setDown(false) })
		},
		// After the hold a new round begins: it may try a again before the
		// redelivered Release cools it (the control plane did not hear of
		// the 429 yet), then fails over to b.
		status: 200, from: 30 * time.Second, to: 30*time.Second + wakeBound,
		check: func(t *testing.T, r *rig, got answer) {
			atts := r.sim.Attempts()
			if len(atts) < 2 || atts[0].Account != "a" || atts[len(atts)-1].Account != "b" {
				t.Errorf("upstream attempts %+v, want a first and b last", atts)
			}
			time.Sleep(5 * time.Second) // the outbox's next sends
			r.cp.mu.Lock()
			defer r.cp.mu.Unlock()
			var redelivered *weirv1.ReleaseRequest
			for _, rel := range r.cp.releases {
				if rel.Outcome.GetClass() == weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED {
					redelivered = rel
				}
			}
			if redelivered == nil {
				t.Fatalf("the 429's Release never arrived; releases %v", r.cp.releases)
			}
			if d := redelivered.Outcome.GetDelay().AsDuration(); d < 29*time.Second {
				t.Errorf("redelivered Release dated %v back, want the ~30s it waited", d)
			}
		},
	}, {
		name: "the client leaves during a hold: the hold ends, nothing goes upstream",
		accounts: func(t0 time.Time) []*fakeAccount {
			return []*fakeAccount{{id: "a", coolUntil: t0.Add(5 * time.Minute), coolReason: weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED}}
		},
		cancelAt: 30 * time.Second,
		from:     30 * time.Second, to: 30 * time.Second,
		check: func(t *testing.T, r *rig, got answer) {
			time.Sleep(10 * time.Minute) // past the storm: nothing may be sent for the gone client
			if n := r.attempts(); n != 0 {
				t.Errorf("%d upstream attempts after the client left", n)
			}
			r.cp.mu.Lock()
			defer r.cp.mu.Unlock()
			if last := r.cp.acquiredAt[len(r.cp.acquiredAt)-1]; last.Sub(r.start) > 30*time.Second {
				t.Errorf("an Acquire at %v, after the client left at 30s", last.Sub(r.start))
			}
		},
	}, {
		name:     "a byte sent to the client is never replayed",
		accounts: healthy("a", "b"),
		faults: func(time.Time) map[string][]sim.Fault {
			return map[string][]sim.Fault{"a": {{Kind: sim.FaultErrorAfterContent}}}
		},
		stream: true,
		status: 200, in: []string{"content_block_delta", "event: error"}, upstream: []string{"a"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { runPartsCase(t, tc) })
		})
	}
}

func runPartsCase(t *testing.T, tc partsCase) {
	t0 := time.Now()
	var accounts []*fakeAccount
	if tc.accounts != nil {
		accounts = tc.accounts(t0)
	}
	cp := newFakeCP(accounts...)
	if tc.settings != nil {
		tc.settings(cp.settings)
	}
	r := newRig(t, cp, func(c *Config) {
		c.CapacityHold = cp.settings.CapacityHold.AsDuration()
	})
	if tc.faults != nil {
		for id, fs := range tc.faults(t0) {
			if err := r.sim.AddFaults(id, fs...); err != nil {
				t.Fatal(err)
			}
		}
	}
	synctest.Wait() // the settings read, the WatchPool stream ready
	if tc.script != nil {
		tc.script(r)
	}
	ctx := t.Context()
	if tc.cancelAt > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		r.at(tc.cancelAt, cancel)
	}
	got := r.send(ctx, tc.stream)
	if tc.cancelAt == 0 && got.status != tc.status {
		t.Fatalf("status %d, want %d: %s", got.status, tc.status, got.body)
	}
	for _, s := range tc.in {
		if !strings.Contains(got.body, s) {
			t.Errorf("body lacks %q: %s", s, got.body)
		}
	}
	to := max(tc.to, tc.from)
	if got.at < tc.from || got.at > to {
		t.Errorf("answered at %v, want in [%v, %v]", got.at, tc.from, to)
	}
	if tc.upstream != nil {
		var tried []string
		for _, a := range r.sim.Attempts() {
			tried = append(tried, a.Account)
		}
		if strings.Join(tried, ",") != strings.Join(tc.upstream, ",") {
			t.Errorf("upstream attempts on %v, want %v", tried, tc.upstream)
		}
	}
	if tc.check != nil {
		tc.check(t, r, got)
	}
}

func strconvUnix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
