package notify

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

var t0 = time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)

var (
	a1 = uuid.MustParse("00000000-0000-0000-0000-000000000001")
	a2 = uuid.MustParse("00000000-0000-0000-0000-000000000002")
	a3 = uuid.MustParse("00000000-0000-0000-0000-000000000003")
)

func acct(id uuid.UUID, mods ...func(*AccountState)) AccountState {
	a := AccountState{ID: id, Label: "acct-" + id.String()[35:], Provider: "anthropic"}
	for _, m := range mods {
		m(&a)
	}
	return a
}

func cooling(a *AccountState) { a.Cooling = true }
func spent(a *AccountState)   { a.Spent = true }
func paused(a *AccountState)  { a.Paused = true }
func brokenAt(at time.Time) func(*AccountState) {
	return func(a *AccountState) { a.BrokenAt, a.BrokenReason = &at, "credential rejected 3 times (401)" }
}

// summary is a run's changes as sorted lines: "+subject level notified",
// "-subject", "kind dedup-subject".
func summary(ch Changes) string {
	var out []string
	for _, m := range ch.Put {
		out = append(out, fmt.Sprintf("+%s %s %v", m.Subject, m.Level, m.Notified))
	}
	for _, s := range ch.Delete {
		out = append(out, "-"+s)
	}
	for _, e := range ch.Events {
		key, _, _ := strings.Cut(e.DedupKey, "@")
		out = append(out, e.Kind+" "+key)
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// TestEvaluate: the marks and what is observed in, the marks to write
// and the events to raise out.
func TestEvaluate(t *testing.T) {
	t.Parallel()
	low := Thresholds{PoolLow: 1, BreakerAfter: 5 * time.Minute}
	mark := func(subject, level string, since time.Time, notified bool) Mark {
		return Mark{Subject: subject, Level: level, Since: since, Notified: notified}
	}
	acc3 := "account/" + a3.String()
	for _, tc := range []struct {
		name  string
		marks []Mark
		obs   Observed
		th    Thresholds
		want  string
	}{
		{name: "all serving, nothing marked",
			obs: Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3)}}, th: low, want: ""},
		{name: "mixed pool exhausted: one cooling, one paused, one broken",
			obs: Observed{Accounts: []AccountState{acct(a1, cooling), acct(a2, paused), acct(a3, brokenAt(t0))}}, th: low,
			want: "+" + acc3 + " broken true; +pool/anthropic exhausted true; account_broken " + a3.String() + "; pool_exhausted pool/anthropic:exhausted"},
		{name: "exhausted, marked: nothing new",
			marks: []Mark{mark(acc3, "broken", t0, true), mark("pool/anthropic", "exhausted", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1, spent), acct(a2, paused), acct(a3, brokenAt(t0))}}, th: low, want: ""},
		{name: "one of three back: restored, still low",
			marks: []Mark{mark(acc3, "broken", t0, true), mark("pool/anthropic", "exhausted", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2, paused), acct(a3, brokenAt(t0))}}, th: low,
			want: "+pool/anthropic low true; pool_restored pool/anthropic:low"},
		{name: "one of three back, low off: restored",
			marks: []Mark{mark(acc3, "broken", t0, true), mark("pool/anthropic", "exhausted", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2, paused), acct(a3, brokenAt(t0))}}, th: Thresholds{},
			want: "-pool/anthropic; pool_restored pool/anthropic:ok"},
		{name: "the broken account mended",
			marks: []Mark{mark(acc3, "broken", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3)}}, th: low,
			want: "-" + acc3 + "; account_recovered " + a3.String()},
		{name: "broken again since the mark",
			marks: []Mark{mark(acc3, "broken", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3, brokenAt(t0.Add(time.Hour)))}}, th: low,
			want: "+" + acc3 + " broken true; account_broken " + a3.String()},
		{name: "a deleted account's mark goes quietly",
			marks: []Mark{mark(acc3, "broken", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2)}}, th: low,
			want: "-" + acc3},
		{name: "a provider with no accounts left: its mark goes quietly",
			marks: []Mark{mark("pool/openai", "exhausted", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1)}}, th: low,
			want: "-pool/openai"},
		{name: "low: one of three serves",
			obs: Observed{Accounts: []AccountState{acct(a1), acct(a2, cooling), acct(a3, spent)}}, th: low,
			want: "+pool/anthropic low true; pool_low pool/anthropic:low"},
		{name: "low off",
			obs: Observed{Accounts: []AccountState{acct(a1), acct(a2, cooling), acct(a3, spent)}}, th: Thresholds{}, want: ""},
		{name: "low to exhausted",
			marks: []Mark{mark("pool/anthropic", "low", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1, cooling), acct(a2, cooling), acct(a3, spent)}}, th: low,
			want: "+pool/anthropic exhausted true; pool_exhausted pool/anthropic:exhausted"},
		{name: "low back to ok",
			marks: []Mark{mark("pool/anthropic", "low", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3, spent)}}, th: low,
			want: "-pool/anthropic; pool_restored pool/anthropic:ok"},
		{name: "a pool of one that serves is not low",
			obs: Observed{Accounts: []AccountState{acct(a1)}}, th: low, want: ""},
		{name: "a family gated on two of three: low for the family only",
			obs: Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3)},
				Gates: []Gate{{a1, "opus"}, {a2, "opus"}}}, th: low,
			want: "+pool/anthropic/opus low true; pool_low pool/anthropic/opus:low"},
		{name: "a family worse than its provider: both told",
			obs: Observed{Accounts: []AccountState{acct(a1, cooling), acct(a2, cooling), acct(a3)},
				Gates: []Gate{{a3, "opus"}}}, th: low,
			want: "+pool/anthropic low true; +pool/anthropic/opus exhausted true; pool_exhausted pool/anthropic/opus:exhausted; pool_low pool/anthropic:low"},
		{name: "provider exhausted covers the family",
			obs: Observed{Accounts: []AccountState{acct(a1, cooling), acct(a2, cooling), acct(a3, paused)},
				Gates: []Gate{{a3, "opus"}}}, th: low,
			want: "+pool/anthropic exhausted true; pool_exhausted pool/anthropic:exhausted"},
		{name: "a notified family is told when its gates lift",
			marks: []Mark{mark("pool/anthropic/opus", "exhausted", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3)}}, th: low,
			want: "-pool/anthropic/opus; pool_restored pool/anthropic/opus:ok"},
		{name: "a notified family stays marked while its provider is worse",
			marks: []Mark{mark("pool/anthropic/opus", "low", t0, true), mark("pool/anthropic", "exhausted", t0, true)},
			obs:   Observed{Accounts: []AccountState{acct(a1, cooling), acct(a2, cooling), acct(a3, cooling)}, Gates: []Gate{{a1, "opus"}}}, th: low,
			want: ""},
		{name: "a breaker just open: marked, not yet told",
			obs: Observed{Accounts: []AccountState{acct(a1)}, Breakers: []Breaker{{"anthropic", "opus"}}}, th: low,
			want: "+breaker/anthropic/opus open false"},
		{name: "a breaker open under the threshold",
			marks: []Mark{mark("breaker/anthropic/opus", "open", t0.Add(-4*time.Minute), false)},
			obs:   Observed{Accounts: []AccountState{acct(a1)}, Breakers: []Breaker{{"anthropic", "opus"}}}, th: low,
			want: ""},
		{name: "a breaker open past the threshold",
			marks: []Mark{mark("breaker/anthropic/opus", "open", t0.Add(-5*time.Minute), false)},
			obs:   Observed{Accounts: []AccountState{acct(a1)}, Breakers: []Breaker{{"anthropic", "opus"}}}, th: low,
			want: "+breaker/anthropic/opus open true; breaker_open_long breaker/anthropic/opus"},
		{name: "a told breaker still open",
			marks: []Mark{mark("breaker/anthropic/opus", "open", t0.Add(-time.Hour), true)},
			obs:   Observed{Accounts: []AccountState{acct(a1)}, Breakers: []Breaker{{"anthropic", "opus"}}}, th: low,
			want: ""},
		{name: "a told breaker closed",
			marks: []Mark{mark("breaker/anthropic/opus", "open", t0.Add(-time.Hour), true)},
			obs:   Observed{Accounts: []AccountState{acct(a1)}}, th: low,
			want: "-breaker/anthropic/opus; breaker_closed breaker/anthropic/opus"},
		{name: "an untold breaker closed quietly",
			marks: []Mark{mark("breaker/anthropic/opus", "open", t0.Add(-time.Minute), false)},
			obs:   Observed{Accounts: []AccountState{acct(a1)}}, th: low,
			want: "-breaker/anthropic/opus"},
		{name: "breaker_notify_after 0: told at first sight",
			obs: Observed{Accounts: []AccountState{acct(a1)}, Breakers: []Breaker{{"anthropic", "opus"}}}, th: Thresholds{PoolLow: 1},
			want: "+breaker/anthropic/opus open true; breaker_open_long breaker/anthropic/opus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ch := Evaluate(tc.marks, tc.obs, tc.th, t0)
			if got := summary(ch); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
			for _, ev := range ch.Events {
				if err := ev.check(); err != nil {
					t.Errorf("%s: %v", ev.Kind, err)
				}
			}
		})
	}
}

// TestEvaluateTexts: what an operator reads.
func TestEvaluateTexts(t *testing.T) {
	t.Parallel()
	ch := Evaluate(nil, Observed{Accounts: []AccountState{acct(a1, cooling), acct(a2, paused), acct(a3, brokenAt(t0.Add(-time.Minute)))}},
		Thresholds{PoolLow: 1}, t0)
	texts := map[string]string{}
	for _, ev := range ch.Events {
		texts[ev.Kind] = ev.Text
	}
	if want := "anthropic: no account can serve now (3 accounts: 1 paused, 1 broken, 1 cooling)"; texts[PoolExhausted] != want {
		t.Errorf("pool_exhausted: %q, want %q", texts[PoolExhausted], want)
	}
	if want := `account "acct-3" (anthropic) is broken: credential rejected 3 times (401)`; texts[AccountBroken] != want {
		t.Errorf("account_broken: %q, want %q", texts[AccountBroken], want)
	}
	ch = Evaluate(ch.Put, Observed{Accounts: []AccountState{acct(a1), acct(a2), acct(a3)}}, Thresholds{PoolLow: 1}, t0.Add(12*time.Minute))
	texts = map[string]string{}
	for _, ev := range ch.Events {
		texts[ev.Kind] = ev.Text
	}
	if want := "anthropic: 3 of 3 accounts can serve again (was exhausted for 12m)"; texts[PoolRestored] != want {
		t.Errorf("pool_restored: %q, want %q", texts[PoolRestored], want)
	}
	if want := `account "acct-3" (anthropic) is no longer broken, after 13m`; texts[AccountRecovered] != want {
		t.Errorf("account_recovered: %q, want %q", texts[AccountRecovered], want)
	}
}

// TestEvaluateProperties runs random sequences of observations through
// Evaluate, writing its marks back as the watch does: observing the same
// thing twice raises nothing the second time; each dedup key is raised
// once; each event of a pool changes its level from the one before; and
// a provider's mark always holds its pool's level now.
func TestEvaluateProperties(t *testing.T) {
	t.Parallel()
	ids := []uuid.UUID{a1, a2, a3, uuid.MustParse("00000000-0000-0000-0000-000000000004")}
	raised := map[string]int{}
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		th := Thresholds{PoolLow: r.IntN(3), BreakerAfter: time.Duration(r.IntN(3)) * time.Minute}
		marks := map[string]Mark{}
		list := func() []Mark {
			var out []Mark
			for _, m := range marks {
				out = append(out, m)
			}
			return out
		}
		apply := func(ch Changes) {
			for _, s := range ch.Delete {
				delete(marks, s)
			}
			for _, m := range ch.Put {
				marks[m.Subject] = m
			}
		}
		keys := map[string]bool{}
		lastLevel := map[string]string{}
		now := t0
		brokenSince := map[uuid.UUID]time.Time{}
		for step := range 60 {
			now = now.Add(time.Duration(1+r.IntN(90)) * time.Second)
			var obs Observed
			for i, id := range ids {
				a := AccountState{ID: id, Label: fmt.Sprint("a", i), Provider: []string{"anthropic", "openai"}[i%2]}
				switch r.IntN(6) {
				case 0:
					a.Paused = true
				case 1:
					if _, ok := brokenSince[id]; !ok {
						brokenSince[id] = now
					}
					at := brokenSince[id]
					a.BrokenAt = &at
				case 2:
					a.Cooling = true
				case 3:
					a.Spent = true
				}
				if a.BrokenAt == nil {
					delete(brokenSince, id)
				}
				if r.IntN(3) == 0 {
					obs.Gates = append(obs.Gates, Gate{id, []string{"opus", "sonnet"}[r.IntN(2)]})
				}
				obs.Accounts = append(obs.Accounts, a)
			}
			if r.IntN(2) == 0 {
				obs.Breakers = append(obs.Breakers, Breaker{"anthropic", "opus"})
			}
			ch := Evaluate(list(), obs, th, now)
			for _, ev := range ch.Events {
				raised[ev.Kind]++
				if err := ev.check(); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				if keys[ev.Kind+" "+ev.DedupKey] {
					t.Fatalf("seed %d step %d: %s %s raised twice", seed, step, ev.Kind, ev.DedupKey)
				}
				keys[ev.Kind+" "+ev.DedupKey] = true
				if lvl, ok := ev.Fields["level"].(string); ok {
					subject, _, _ := strings.Cut(ev.DedupKey, ":")
					if prev, seen := lastLevel[subject]; (seen && prev == lvl) || (!seen && lvl == "ok") {
						t.Fatalf("seed %d step %d: %s raised level %s after %q", seed, step, subject, lvl, prev)
					}
					lastLevel[subject] = lvl
				}
			}
			apply(ch)
			if again := Evaluate(list(), obs, th, now); len(again.Events)+len(again.Put)+len(again.Delete) > 0 {
				t.Fatalf("seed %d step %d: the same observation again changed %s", seed, step, summary(again))
			}
			for _, p := range pools(obs, nil) {
				if p.family != "" {
					continue
				}
				if got, want := marks[p.subject()].Level, p.level(th.PoolLow); got != want {
					t.Fatalf("seed %d step %d: %s marked %q, is %q", seed, step, p.subject(), got, want)
				}
			}
		}
	}
	// The sequences reach every transition the watch raises.
	for _, k := range []string{AccountBroken, AccountRecovered, PoolExhausted, PoolLow, PoolRestored, BreakerOpenLong, BreakerClosed} {
		if raised[k] < 10 {
			t.Errorf("%s raised %d times over every seed; the sequences miss it", k, raised[k])
		}
	}
}
