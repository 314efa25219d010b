package policy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// pooled is a PooledWindow as the table states it; nil is no window.
type pooled struct {
	util               float64
	reset              time.Duration // from epoch
	accounts, readings int
}

func (p *pooled) check(t *testing.T, name string, got *PooledWindow) {
	t.Helper()
	switch {
	case p == nil && got == nil:
		return
	case p == nil || got == nil:
		t.Errorf("%s = %+v, want %+v", name, got, p)
		return
	}
	if math.Abs(got.Utilization-p.util) > 1e-9 || !got.ResetsAt.Equal(epoch.Add(p.reset)) ||
		got.Accounts != p.accounts || got.Readings != p.readings {
		t.Errorf("%s = %.4f reset %v accounts %d readings %d, want %.4f reset %v accounts %d readings %d", name,
			got.Utilization, got.ResetsAt.Sub(epoch), got.Accounts, got.Readings, p.util, p.reset, p.accounts, p.readings)
	}
}

func TestPoolWindows(t *testing.T) {
	t.Parallel()
	messages := RouteRequest{Surface: weirv1.Surface_SURFACE_MESSAGES}
	for _, tc := range []struct {
		name       string
		cands      []Candidate
		req        RouteRequest
		five, week *pooled
	}{
		{name: "empty pool"},
		{
			name:  "API keys have no windows",
			cands: []Candidate{c("k1"), c("k2", fiveHour(0.5, time.Hour))},
		},
		{
			name: "one spent, one serving: the mean, the soonest reset",
			cands: []Candidate{
				c("spent", oauth(), fiveHour(1, 2*time.Hour), weekly(0.4, 50*time.Hour)),
				c("serving", oauth(), fiveHour(0.2, 3*time.Hour), weekly(0.1, 90*time.Hour)),
			},
			five: &pooled{util: 0.6, reset: 2 * time.Hour, accounts: 2, readings: 2},
			week: &pooled{util: 0.25, reset: 50 * time.Hour, accounts: 2, readings: 2},
		},
		{
			name: "an account without a reading counts as unused",
			cands: []Candidate{
				c("read", oauth(), fiveHour(0.8, time.Hour)),
				c("fresh", oauth()),
			},
			five: &pooled{util: 0.4, reset: time.Hour, accounts: 2, readings: 1},
		},
		{
			name: "a reading whose reset passed is no evidence",
			cands: []Candidate{
				c("stale", oauth(), fiveHour(1, -time.Minute)),
				c("read", oauth(), fiveHour(0.5, time.Hour)),
			},
			five: &pooled{util: 0.25, reset: time.Hour, accounts: 2, readings: 1},
		},
		{
			name:  "no current reading at all: no window",
			cands: []Candidate{c("stale", oauth(), fiveHour(0.7, -time.Hour)), c("fresh", oauth())},
		},
		{
			name: "paused, broken and rejected accounts are not the key's to use",
			cands: []Candidate{
				c("paused", oauth(), paused(), fiveHour(0, time.Hour)),
				c("broken", oauth(), broken(), fiveHour(0, time.Hour)),
				c("rejected", oauth(), credentialRejected(time.Hour), fiveHour(0, time.Hour)),
				c("ok", oauth(), fiveHour(0.9, 4*time.Hour)),
			},
			five: &pooled{util: 0.9, reset: 4 * time.Hour, accounts: 1, readings: 1},
		},
		{
			name: "a cooling account (not for quota) keeps its reading",
			cands: []Candidate{
				c("cooling", oauth(), cooling(time.Minute, true), fiveHour(0.3, time.Hour)),
				c("ok", oauth(), fiveHour(0.1, 2*time.Hour)),
			},
			five: &pooled{util: 0.2, reset: time.Hour, accounts: 2, readings: 2},
		},
		{
			name: "a quota cooldown on the five-hour window is that window spent",
			cands: []Candidate{
				c("blocked", oauth(), codex(), quotaCooling(90*time.Minute, 90*time.Minute, 300, "usage limit"), fiveHour(0.5, 90*time.Minute)),
				c("ok", oauth(), codex(), fiveHour(0, 4*time.Hour)),
			},
			req:  RouteRequest{Surface: weirv1.Surface_SURFACE_RESPONSES},
			five: &pooled{util: 0.5, reset: 90 * time.Minute, accounts: 2, readings: 2},
		},
		{
			name: "a surface's providers only",
			cands: []Candidate{
				c("claude", oauth(), fiveHour(1, time.Hour)),
				c("chatgpt", oauth(), codex(), fiveHour(0.3, 2*time.Hour)),
			},
			req:  RouteRequest{Surface: weirv1.Surface_SURFACE_RESPONSES},
			five: &pooled{util: 0.3, reset: 2 * time.Hour, accounts: 1, readings: 1},
		},
		{
			name:  "a utilization past 1 counts as 1",
			cands: []Candidate{c("over", oauth(), weekly(1.3, time.Hour)), c("ok", oauth(), weekly(0.5, 2*time.Hour))},
			week:  &pooled{util: 0.75, reset: time.Hour, accounts: 2, readings: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if req.Surface == weirv1.Surface_SURFACE_UNSPECIFIED {
				req = messages
			}
			five, week := PoolWindows(tc.cands, req, epoch)
			tc.five.check(t, "five-hour", five)
			tc.week.check(t, "weekly", week)
		})
	}
}

// TestPoolWindowsBounds: whatever the pool, a pooled window's utilization
// lies within its accounts' (each counted within 0..1, an unread one as
// 0), its reset is the soonest current one, and it pools exactly the
// subscriptions that may serve.
func TestPoolWindowsBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	req := RouteRequest{Surface: weirv1.Surface_SURFACE_MESSAGES}
	for range 2000 {
		var cands []Candidate
		lo, hi := 1.0, 0.0
		var soonest time.Time
		subs := 0
		for i := range rng.IntN(6) {
			var opts []func(*Candidate)
			sub := rng.IntN(4) > 0
			if sub {
				opts = append(opts, oauth())
			}
			off := rng.IntN(5) == 0
			if off {
				opts = append(opts, paused())
			}
			u := rng.Float64()*1.2 - 0.1
			reset := time.Duration(rng.IntN(600)-60) * time.Minute
			read := rng.IntN(3) > 0
			if read {
				opts = append(opts, fiveHour(u, reset))
			}
			cands = append(cands, c(string(rune('a'+i)), opts...))
			if !sub || off {
				continue
			}
			subs++
			eff := 0.0
			if read && reset > 0 {
				eff = min(max(u, 0), 1)
				if eff >= SpentAt {
					eff = 1
				}
				if r := epoch.Add(reset); soonest.IsZero() || r.Before(soonest) {
					soonest = r
				}
			}
			lo, hi = min(lo, eff), max(hi, eff)
		}
		five, _ := PoolWindows(cands, req, epoch)
		if soonest.IsZero() {
			if five != nil {
				t.Fatalf("%d accounts, none with a current reading: pooled %+v", len(cands), five)
			}
			continue
		}
		if five == nil {
			t.Fatalf("current readings but no pooled window")
		}
		if five.Accounts != subs || five.Utilization < lo-1e-9 || five.Utilization > hi+1e-9 || !five.ResetsAt.Equal(soonest) {
			t.Fatalf("pooled %+v: want %d accounts, utilization within [%.3f, %.3f], reset %v", five, subs, lo, hi, soonest)
		}
	}
}
