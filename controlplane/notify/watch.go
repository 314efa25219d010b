package notify

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// The watch: every WatchInterval one control plane reads the accounts,
// their live family gates and the open overload breakers (Observed),
// compares them with the last notified state (the marks), and raises an
// event for each transition (Evaluate). It runs under one advisory lock,
// marks and events in one transaction, so a transition is notified once
// however many control planes run the check.

// WatchInterval is how often the watch runs: a transition is notified
// within about this long of happening. A state that comes and goes inside
// one interval (an account broken and mended in seconds) is not notified.
const WatchInterval = 15 * time.Second

// AccountState is one account as the watch reads it.
type AccountState struct {
	ID       uuid.UUID
	Label    string
	Provider string
	Paused   bool
	// BrokenAt is when the account was marked broken, nil when it is not;
	// BrokenReason says why.
	BrokenAt     *time.Time
	BrokenReason string
	// Cooling: a live cooldown. Spent: a live account-wide usage window
	// at policy.SpentAt or above. Routing skips both until they pass.
	Cooling, Spent bool
}

// Gate is a live family gate: the account cannot serve that family now.
type Gate struct {
	Account uuid.UUID
	Family  string
}

// Breaker is an overload breaker open now.
type Breaker struct {
	Provider, Family string
}

// Observed is what the watch read.
type Observed struct {
	Accounts []AccountState
	Gates    []Gate
	Breakers []Breaker
}

// Thresholds are the watch's settings.
type Thresholds struct {
	// PoolLow: a pool of more than PoolLow accounts is low when 1 to
	// PoolLow of them can serve now (the pool_low_accounts setting); 0
	// never reports low.
	PoolLow int
	// BreakerAfter is how long a breaker stays open before it is
	// notified (breaker_notify_after).
	BreakerAfter time.Duration
}

// Mark is the last notified state of one subject, stored between runs.
// Subjects are "account/<id>", "pool/<provider>",
// "pool/<provider>/<family>" and "breaker/<provider>/<family>"; a
// subject in its normal state (not broken, a pool that serves, a closed
// breaker) has none.
type Mark struct {
	Subject string
	// Level is "broken" (an account), "low" or "exhausted" (a pool),
	// "open" (a breaker).
	Level string
	// Since is when the level began: an account's broken_at, when the
	// watch first saw a pool at its level or a breaker open.
	Since time.Time
	// Notified: the level's event was raised (a breaker's waits for
	// BreakerAfter; the others are raised at once).
	Notified bool
}

// The levels.
const (
	levelOK        = ""
	levelLow       = "low"
	levelExhausted = "exhausted"
	levelBroken    = "broken"
	levelOpen      = "open"
)

// Changes are what a run writes: the marks to put and the subjects to
// delete, and the events to raise.
type Changes struct {
	Put    []Mark
	Delete []string
	Events []Event
}

// Evaluate compares what was observed at now with the marks of the last
// run, and returns the transitions: each raises one event, and its mark
// records it. It reads no clock and no database.
//
//   - An account broken (a new broken_at) raises account_broken; a marked
//     account no longer broken raises account_recovered. A deleted
//     account's mark goes without an event.
//   - A pool is a provider's accounts, and a provider's accounts for each
//     model family some of them are gated for (or that has a mark). Its
//     level is exhausted when none can serve now, low when 1 to
//     PoolLow of more than PoolLow can, else ok. A change of level raises
//     one event: pool_low or pool_exhausted for a worse level, and
//     pool_restored for a better one (its level field says which: still
//     low, or ok). A family pool is worse than its provider's only through gates: it
//     raises a worse level only when that is worse than the provider's
//     own (the provider's event already says the rest), and a better one
//     whenever it had raised the worse.
//   - A breaker open BreakerAfter raises breaker_open_long once; when it
//     closes after that, breaker_closed.
func Evaluate(marks []Mark, obs Observed, th Thresholds, now time.Time) Changes {
	prev := make(map[string]Mark, len(marks))
	for _, m := range marks {
		prev[m.Subject] = m
	}
	w := &evaluation{prev: prev, now: now, seen: map[string]bool{}}
	w.accounts(obs.Accounts)
	w.pools(obs, th)
	w.breakers(obs.Breakers, th)
	for _, s := range slices.Sorted(maps.Keys(prev)) {
		if !w.seen[s] {
			w.out.Delete = append(w.out.Delete, s)
			if m := prev[s]; m.Level == levelOpen && m.Notified {
				w.breakerClosed(m)
			}
		}
	}
	return w.out
}

type evaluation struct {
	prev map[string]Mark
	now  time.Time
	// seen are the subjects this run decided; the others' marks go.
	seen map[string]bool
	out  Changes
}

func (w *evaluation) keep(subject string) { w.seen[subject] = true }

func (w *evaluation) put(m Mark) {
	w.seen[m.Subject] = true
	w.out.Put = append(w.out.Put, m)
}

func (w *evaluation) raise(ev Event) { w.out.Events = append(w.out.Events, ev) }

func (w *evaluation) accounts(accounts []AccountState) {
	for _, a := range accounts {
		subject := "account/" + a.ID.String()
		m, marked := w.prev[subject]
		fields := map[string]any{"account_id": a.ID.String(), "account_label": a.Label, "provider": a.Provider}
		switch {
		case a.BrokenAt == nil && marked:
			// Not seen: the mark goes.
			fields["broken_at"] = m.Since.UTC().Format(time.RFC3339)
			fields["broken_seconds"] = int64(w.now.Sub(m.Since).Seconds())
			w.raise(Event{Kind: AccountRecovered, DedupKey: a.ID.String() + "@" + stamp(m.Since), Severity: Info,
				Text:   fmt.Sprintf("account %q (%s) is no longer broken, after %s", a.Label, a.Provider, span(w.now.Sub(m.Since))),
				Fields: fields})
		case a.BrokenAt == nil:
		case marked && m.Since.Equal(*a.BrokenAt):
			w.keep(subject)
		default:
			// Broken, first seen so (or broken again since the mark).
			reason := oneLine(a.BrokenReason, 1000)
			fields["broken_at"] = a.BrokenAt.UTC().Format(time.RFC3339)
			fields["reason"] = reason
			w.put(Mark{Subject: subject, Level: levelBroken, Since: *a.BrokenAt, Notified: true})
			w.raise(Event{Kind: AccountBroken, DedupKey: a.ID.String() + "@" + stamp(*a.BrokenAt), Severity: Critical,
				Text:   oneLine(fmt.Sprintf("account %q (%s) is broken: %s", a.Label, a.Provider, oneLine(reason, 120)), 300),
				Fields: fields})
		}
	}
}

// pool is the accounts of a provider, or of a provider for one family.
type pool struct {
	provider, family string
	total, serving   int
	// out counts the others by why they cannot serve.
	out map[string]int
}

func (p pool) subject() string {
	if p.family == "" {
		return "pool/" + p.provider
	}
	return "pool/" + p.provider + "/" + p.family
}

// name is how a text names the pool: "anthropic", "anthropic opus models".
func (p pool) name() string {
	if p.family == "" {
		return p.provider
	}
	return p.provider + " " + p.family + " models"
}

func (p pool) level(low int) string {
	switch {
	case p.serving == 0:
		return levelExhausted
	case low > 0 && p.total > low && p.serving <= low:
		return levelLow
	}
	return levelOK
}

// why is "1 paused, 1 broken, 1 cooling", in a fixed order.
func (p pool) why() string {
	var parts []string
	for _, r := range []string{"paused", "broken", "cooling", "spent", "gated"} {
		if n := p.out[r]; n > 0 {
			label := r
			if r == "gated" {
				label = "gated for " + p.family
			}
			parts = append(parts, fmt.Sprintf("%d %s", n, label))
		}
	}
	return strings.Join(parts, ", ")
}

// blocked is why an account cannot serve any family now, "" when it can.
func blocked(a AccountState) string {
	switch {
	case a.Paused:
		return "paused"
	case a.BrokenAt != nil:
		return "broken"
	case a.Cooling:
		return "cooling"
	case a.Spent:
		return "spent"
	}
	return ""
}

// pools builds every provider's pool and its family pools.
func pools(obs Observed, prev map[string]Mark) []pool {
	gated := map[uuid.UUID][]string{}
	for _, g := range obs.Gates {
		gated[g.Account] = append(gated[g.Account], g.Family)
	}
	byProvider := map[string][]AccountState{}
	for _, a := range obs.Accounts {
		byProvider[a.Provider] = append(byProvider[a.Provider], a)
	}
	var out []pool
	for _, provider := range slices.Sorted(maps.Keys(byProvider)) {
		accounts := byProvider[provider]
		families := map[string]bool{}
		for _, a := range accounts {
			for _, f := range gated[a.ID] {
				families[f] = true
			}
		}
		for s := range prev {
			if rest, ok := strings.CutPrefix(s, "pool/"+provider+"/"); ok && rest != "" {
				families[rest] = true
			}
		}
		for _, family := range append([]string{""}, slices.Sorted(maps.Keys(families))...) {
			p := pool{provider: provider, family: family, total: len(accounts), out: map[string]int{}}
			for _, a := range accounts {
				why := blocked(a)
				if why == "" && family != "" && slices.Contains(gated[a.ID], family) {
					why = "gated"
				}
				if why == "" {
					p.serving++
				} else {
					p.out[why]++
				}
			}
			out = append(out, p)
		}
	}
	return out
}

var levelRank = map[string]int{levelOK: 0, levelLow: 1, levelExhausted: 2}

func (w *evaluation) pools(obs Observed, th Thresholds) {
	provider := map[string]string{} // provider → its pool's level now
	for _, p := range pools(obs, w.prev) {
		subject := p.subject()
		now := p.level(th.PoolLow)
		m, marked := w.prev[subject]
		was := levelOK
		if marked {
			was = m.Level
		}
		if p.family == "" {
			provider[p.provider] = now
		}
		switch {
		case now == was:
			if marked {
				w.keep(subject)
			}
			continue
		case p.family != "" && levelRank[now] > levelRank[was] && levelRank[now] <= levelRank[provider[p.provider]]:
			// Worse, but no worse than the provider's pool: its event says
			// so. The mark stays what was notified.
			if marked {
				w.keep(subject)
			}
			continue
		}
		if now != levelOK {
			w.put(Mark{Subject: subject, Level: now, Since: w.now, Notified: true})
		}
		w.raise(w.poolEvent(p, now, was, m))
	}
}

func (w *evaluation) poolEvent(p pool, now, was string, m Mark) Event {
	level := cmp.Or(now, "ok")
	fields := map[string]any{"provider": p.provider, "serving": p.serving, "accounts": p.total, "level": level}
	if p.family != "" {
		fields["family"] = p.family
	}
	for r, n := range p.out {
		fields[r] = n
	}
	if was != levelOK {
		fields["was"] = was
		fields["was_since"] = m.Since.UTC().Format(time.RFC3339)
	}
	why := p.why()
	ev := Event{DedupKey: p.subject() + ":" + level + "@" + stamp(w.now), Fields: fields}
	switch {
	case levelRank[now] < levelRank[was]:
		ev.Kind, ev.Severity = PoolRestored, Info
		ev.Text = fmt.Sprintf("%s: %d of %d accounts can serve again (was %s for %s)", p.name(), p.serving, p.total, was, span(w.now.Sub(m.Since)))
		if now == levelLow {
			ev.Text = fmt.Sprintf("%s: %d of %d accounts can serve again, still low (%s; was exhausted for %s)",
				p.name(), p.serving, p.total, why, span(w.now.Sub(m.Since)))
		}
	case now == levelExhausted:
		if why != "" {
			why = ": " + why
		}
		ev.Kind, ev.Severity = PoolExhausted, Critical
		ev.Text = fmt.Sprintf("%s: no account can serve now (%d account%s%s)", p.name(), p.total, plural(p.total), why)
	default:
		ev.Kind, ev.Severity = PoolLow, Warning
		ev.Text = fmt.Sprintf("%s: only %d of %d accounts can serve now (%s)", p.name(), p.serving, p.total, why)
	}
	ev.Text = oneLine(ev.Text, 300)
	return ev
}

func (w *evaluation) breakers(open []Breaker, th Thresholds) {
	for _, b := range open {
		subject := "breaker/" + b.Provider + "/" + b.Family
		m, marked := w.prev[subject]
		if !marked {
			m = Mark{Subject: subject, Level: levelOpen, Since: w.now}
		}
		if m.Notified || w.now.Sub(m.Since) < th.BreakerAfter {
			if marked {
				w.keep(subject)
			} else {
				w.put(m)
			}
			continue
		}
		m.Notified = true
		w.put(m)
		open := w.now.Sub(m.Since)
		w.raise(Event{Kind: BreakerOpenLong, DedupKey: subject + "@" + stamp(m.Since), Severity: Warning,
			Text: fmt.Sprintf("%s %s overload breaker open for %s: the provider answers overloaded; weir sends only probes",
				b.Provider, b.Family, span(open)),
			Fields: map[string]any{"provider": b.Provider, "family": b.Family,
				"open_since": m.Since.UTC().Format(time.RFC3339), "open_seconds": int64(open.Seconds())}})
	}
}

func (w *evaluation) breakerClosed(m Mark) {
	provider, family, _ := strings.Cut(strings.TrimPrefix(m.Subject, "breaker/"), "/")
	open := w.now.Sub(m.Since)
	w.raise(Event{Kind: BreakerClosed, DedupKey: m.Subject + "@" + stamp(m.Since), Severity: Info,
		Text: fmt.Sprintf("%s %s overload breaker closed after %s", provider, family, span(open)),
		Fields: map[string]any{"provider": provider, "family": family,
			"open_since": m.Since.UTC().Format(time.RFC3339), "open_seconds": int64(open.Seconds())}})
}

// stamp is a time in a dedup key.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// span is a duration for a person: whole seconds under a minute, else
// whole minutes, else hours and minutes.
func span(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(max(d, 0).Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	}
	return strings.TrimSuffix(d.Truncate(time.Minute).String(), "0s")
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
