package chaos

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Kind is a kind of scheduled fault.
type Kind string

// The fault kinds. Each event targets one component (Target) and, except
// the cuts, lasts For: the component is down, paused or blackholed for
// that long, or the simulator's account misbehaves that long.
const (
	// KillWorker and KillControlPlane SIGKILL the process and start a new
	// one For later.
	KillWorker       Kind = "kill_worker"
	KillControlPlane Kind = "kill_controlplane"
	// StopPostgres shuts Postgres down (fast shutdown) and starts it again
	// on the same data directory For later.
	StopPostgres Kind = "stop_postgres"
	// PauseWorker and PauseControlPlane SIGSTOP the process, SIGCONT it For
	// later (always well under the lease TTL).
	PauseWorker       Kind = "pause_worker"
	PauseControlPlane Kind = "pause_controlplane"
	// CutControlPlanes and CutPostgres close every connection through the
	// proxy in front of the control planes, or of Postgres, at once.
	CutControlPlanes Kind = "cut_controlplanes"
	CutPostgres      Kind = "cut_postgres"
	// BlackholeControlPlanes and BlackholePostgres make the proxy forward
	// nothing for For (bytes and new connections wait, like a partition
	// that heals).
	BlackholeControlPlanes Kind = "blackhole_controlplanes"
	BlackholePostgres      Kind = "blackhole_postgres"
	// Upstream makes account Target answer with the simulator's fault
	// Fault for For.
	Upstream Kind = "upstream"
	// Storm makes every Anthropic account answer 529 for For (a spent
	// one goes on answering its 429).
	Storm Kind = "storm"
	// Spent makes Anthropic account Target spent for the whole run: from
	// before the first request, every attempt on it is answered 429 with
	// the unified rejection headers of window Claim, resetting ResetIn
	// after the answer (and a retry-after that long), as a subscription
	// spent for the week answers. At is 0 and For the whole of traffic.
	Spent Kind = "spent"
)

// Kinds lists every kind, in the order reports show them.
var Kinds = []Kind{KillWorker, KillControlPlane, StopPostgres, PauseWorker, PauseControlPlane,
	CutControlPlanes, CutPostgres, BlackholeControlPlanes, BlackholePostgres, Upstream, Storm, Spent}

// Upstream fault kinds the schedule draws from (internal/sim's names),
// with the retry-after a 429 or 529 carries.
var upstreamFaults = []string{
	"overloaded", "unavailable", "rate_limit", "overloaded_event", "error_after_content",
	"reset_before_output", "reset_after_output", "drop_connection",
}

// Event is one scheduled fault.
type Event struct {
	// At is when it starts, from the start of traffic.
	At   time.Duration `json:"at"`
	Kind Kind          `json:"kind"`
	// Target is the worker, control plane or account index; 0 otherwise.
	Target int `json:"target"`
	// For is how long it lasts; 0 for a cut.
	For time.Duration `json:"for"`
	// Fault is the simulator's fault kind for Upstream; RetryAfter its
	// retry-after in seconds (0: none).
	Fault      string `json:"fault,omitempty"`
	RetryAfter int    `json:"retry_after,omitempty"`
	// Claim and ResetIn are, for Spent, the unified claim its 429s reject
	// (five_hour or seven_day) and how long after each answer it resets.
	Claim   string        `json:"claim,omitempty"`
	ResetIn time.Duration `json:"reset_in,omitempty"`
}

// End is when the event is over.
func (e Event) End() time.Duration { return e.At + e.For }

func (e Event) String() string {
	s := fmt.Sprintf("%7s %s", fmtRel(e.At), e.Kind)
	switch e.Kind {
	case KillWorker, PauseWorker:
		s += fmt.Sprintf(" worker %d", e.Target)
	case KillControlPlane, PauseControlPlane:
		s += fmt.Sprintf(" controlplane %d", e.Target)
	case Upstream:
		s += fmt.Sprintf(" account %d %s", e.Target, e.Fault)
		if e.RetryAfter > 0 {
			s += fmt.Sprintf(" (retry-after %ds)", e.RetryAfter)
		}
	case Spent:
		s += fmt.Sprintf(" account %d %s rejected, resets %s after each answer", e.Target, e.Claim, e.ResetIn)
	}
	if e.For > 0 {
		s += " for " + e.For.Round(10*time.Millisecond).String()
	}
	return s
}

// fmtRel writes a time from the start, "+3.21s".
func fmtRel(d time.Duration) string {
	return fmt.Sprintf("%+.2fs", d.Seconds())
}

// ScheduleConfig bounds a schedule.
type ScheduleConfig struct {
	// Duration is how long traffic runs.
	Duration time.Duration
	// Warmup is the fault-free start; Quiet the fault-free end: every
	// event is over Quiet before traffic stops.
	Warmup, Quiet time.Duration
	// Every is the mean time between event starts.
	Every time.Duration
	// Workers, ControlPlanes and Accounts count the targets; Anthropic
	// says which accounts are Anthropic ones (the rest are OpenAI).
	Workers, ControlPlanes int
	Anthropic              []bool
	// MaxPause bounds a pause (well under the lease TTL); MaxDown a
	// process's or Postgres's downtime and a blackhole.
	MaxPause, MaxDown time.Duration
}

// weights are the kinds' relative frequencies.
var weights = []struct {
	k Kind
	w int
}{
	{KillWorker, 3}, {KillControlPlane, 3}, {StopPostgres, 2}, {PauseWorker, 2}, {PauseControlPlane, 2},
	{CutControlPlanes, 2}, {CutPostgres, 1}, {BlackholeControlPlanes, 1}, {BlackholePostgres, 1},
	{Upstream, 8}, {Storm, 1},
}

// Plan draws the schedule of seed: events in order of start, none before
// Warmup, each over by Duration-Quiet, at most one at a time on each
// target, never every worker down or paused at once (the clients would
// have nowhere to go), and at most one account of a provider misbehaving
// at a time (a storm, every Anthropic account at once, apart), so that
// some account of each surface is free of faults most of the time.
//
// First come the seed's Spent accounts (mixedPool), at 0 for the whole
// run; no Upstream fault targets one (its 429 would hide the fault), so
// outside storms two Anthropic accounts are never out at once beside
// them, and some Anthropic account can serve once each storm is over.
func Plan(seed uint64, c ScheduleConfig) []Event {
	out := mixedPool(seed, c)
	spent := map[int]bool{}
	for _, e := range out {
		spent[e.Target] = true
	}
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	end := c.Duration - c.Quiet
	total := 0
	for _, w := range weights {
		total += w.w
	}
	busy := map[string]time.Duration{} // target → when its last event ends
	for at := c.Warmup + jitter(r, c.Every); at < end; at += jitter(r, c.Every) {
		x := r.IntN(total)
		var k Kind
		for _, w := range weights {
			if x < w.w {
				k = w.k
				break
			}
			x -= w.w
		}
		e := Event{At: at, Kind: k}
		var key string
		switch k {
		case KillWorker, PauseWorker:
			e.Target = r.IntN(c.Workers)
			key = fmt.Sprintf("worker/%d", e.Target)
		case KillControlPlane, PauseControlPlane:
			e.Target = r.IntN(c.ControlPlanes)
			key = fmt.Sprintf("controlplane/%d", e.Target)
		case StopPostgres, CutPostgres, BlackholePostgres:
			key = "postgres"
		case CutControlPlanes, BlackholeControlPlanes:
			key = "controlplanes"
		case Upstream:
			e.Target = r.IntN(len(c.Anthropic))
			key = fmt.Sprintf("account/%d", e.Target)
			e.Fault = upstreamFaults[r.IntN(len(upstreamFaults))]
			if e.Fault == "rate_limit" || e.Fault == "overloaded" || e.Fault == "unavailable" {
				e.RetryAfter = r.IntN(4) // 0: none
			}
		case Storm:
			key = "storm"
		}
		switch k {
		case PauseWorker, PauseControlPlane:
			e.For = between(r, 300*time.Millisecond, c.MaxPause)
		case CutControlPlanes, CutPostgres:
		case Upstream, Storm:
			e.For = between(r, time.Second, c.MaxDown)
		default:
			e.For = between(r, 500*time.Millisecond, c.MaxDown)
		}
		if e.End() > end {
			e.For = end - e.At
			if k == CutControlPlanes || k == CutPostgres {
				e.For = 0
			} else if e.For < 200*time.Millisecond {
				continue
			}
		}
		if busy[key] > e.At || (k == Upstream && spent[e.Target]) || !allowed(out, e, c) {
			continue
		}
		busy[key] = e.End()
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return out
}

// Mixed pools: the share of seeds (in percent) with one spent Anthropic
// account, and with two; never every Anthropic account, nor more than
// half of them.
const (
	mixedOnePercent = 45
	mixedTwoPercent = 15
)

// mixedPool draws seed's Spent accounts from a stream of its own, so that
// the rest of the schedule is drawn as before: none, one (mixedOnePercent
// of seeds) or two (mixedTwoPercent), never more than half the Anthropic
// accounts; each spent on five_hour (a reset 1–5 h away) or seven_day
// (5–72 h), in order of account.
func mixedPool(seed uint64, c ScheduleConfig) []Event {
	r := rand.New(rand.NewPCG(seed, 0x3c6ef372fe94f82b))
	var anth []int
	for i, a := range c.Anthropic {
		if a {
			anth = append(anth, i)
		}
	}
	n := 0
	switch x := r.IntN(100); {
	case x < mixedOnePercent:
		n = 1
	case x < mixedOnePercent+mixedTwoPercent:
		n = 2
	}
	n = min(n, len(anth)/2)
	r.Shuffle(len(anth), func(i, j int) { anth[i], anth[j] = anth[j], anth[i] })
	picked := slices.Sorted(slices.Values(anth[:n]))
	var out []Event
	for _, i := range picked {
		e := Event{Kind: Spent, Target: i, For: c.Duration, Fault: "rate_limit", Claim: "five_hour",
			ResetIn: time.Duration(60+r.IntN(4*60)) * time.Minute}
		if r.IntN(2) == 0 {
			e.Claim, e.ResetIn = "seven_day", time.Duration(5*60+r.IntN(67*60))*time.Minute
		}
		out = append(out, e)
	}
	return out
}

// allowed says whether e may join the events so far: not the last worker
// out, not a second misbehaving account of a provider.
func allowed(so []Event, e Event, c ScheduleConfig) bool {
	overlaps := func(o Event) bool { return o.At < e.End() && e.At < o.End() }
	switch e.Kind {
	case KillWorker, PauseWorker:
		down := map[int]bool{e.Target: true}
		for _, o := range so {
			if (o.Kind == KillWorker || o.Kind == PauseWorker) && overlaps(o) {
				down[o.Target] = true
			}
		}
		return len(down) < c.Workers
	case Upstream:
		for _, o := range so {
			if !overlaps(o) {
				continue
			}
			if o.Kind == Storm && c.Anthropic[e.Target] {
				return false
			}
			if o.Kind == Upstream && c.Anthropic[o.Target] == c.Anthropic[e.Target] {
				return false
			}
		}
	case Storm:
		for _, o := range so {
			if o.Kind == Upstream && c.Anthropic[o.Target] && overlaps(o) {
				return false
			}
		}
	}
	return true
}

// jitter is a wait around mean: uniform in [mean/2, 3·mean/2).
func jitter(r *rand.Rand, mean time.Duration) time.Duration {
	return mean/2 + time.Duration(r.Int64N(int64(mean)))
}

// between is uniform in [lo, hi).
func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}
