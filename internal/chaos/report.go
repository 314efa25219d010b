package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// outcomes counts a seed's requests by outcome; a cut request whose
// worker was killed under it counts as "killed".
func (r *Result) outcomes() map[string]int {
	v := newView(r.Record)
	out := map[string]int{}
	for i := range r.Record.Requests {
		q := &r.Record.Requests[i]
		o := q.Outcome
		if _, killed := v.killedUnder(q); killed && o == OutcomeCut {
			o = "killed"
		}
		out[o]++
	}
	return out
}

// events counts the faults as they ran, by kind.
func (r *Result) events() map[Kind]int {
	out := map[Kind]int{}
	for _, a := range r.Record.Applied {
		out[a.Event.Kind]++
	}
	return out
}

// spentTries lists the spent accounts with the attempts each got
// ("anth-1 3"), "-" when none was spent.
func (r *Result) spentTries() string {
	v := newView(r.Record)
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(v.spent)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, len(v.spentAttempts(name))))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// Summary is one line: requests by outcome, events, the spent accounts'
// attempts, violations.
func (r *Result) Summary() string {
	o := r.outcomes()
	known := 0
	for _, v := range r.Violations {
		if v.Known != "" {
			known++
		}
	}
	return fmt.Sprintf("%s, %d requests (%s), %d upstream attempts, %d events, spent tried %s, %d violations (%d known)",
		r.Elapsed.Round(100*time.Millisecond), len(r.Record.Requests), countList(o), len(r.Record.Attempts), len(r.Record.Applied),
		r.spentTries(), len(r.Violations), known)
}

func countList(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// Report is a run of many seeds.
type Report struct {
	Command  string
	Started  time.Time
	Elapsed  time.Duration
	Results  []*Result
	Errors   map[uint64]string // seeds that could not run
	Tolerate bool
}

// Markdown writes the report: seeds, events injected by kind, requests,
// violations by invariant, and each violation's timeline.
func (rep *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# weir chaos, %s\n\n", rep.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Command: `%s`; %d seeds in %s", rep.Command, len(rep.Results), rep.Elapsed.Round(time.Second))
	if n := len(rep.Results); n > 0 {
		fmt.Fprintf(&b, " (%.1f s a seed)", rep.Elapsed.Seconds()/float64(n))
	}
	b.WriteString(".")
	if rep.Tolerate {
		b.WriteString(" Known failures tolerated (--tolerate-known).")
	}
	b.WriteString("\n\n")
	events := map[Kind]int{}
	outcomes := map[string]int{}
	byInv := map[int][2]int{} // invariant → [violations, of which known]
	seedsByInv := map[int][]uint64{}
	for _, r := range rep.Results {
		for k, n := range r.events() {
			events[k] += n
		}
		for k, n := range r.outcomes() {
			outcomes[k] += n
		}
		seen := map[int]bool{}
		for _, v := range r.Violations {
			c := byInv[v.Invariant]
			c[0]++
			if v.Known != "" {
				c[1]++
			}
			byInv[v.Invariant] = c
			if !seen[v.Invariant] {
				seen[v.Invariant] = true
				seedsByInv[v.Invariant] = append(seedsByInv[v.Invariant], r.Seed)
			}
		}
	}
	b.WriteString("## Events injected\n\n| kind | count |\n| --- | --- |\n")
	for _, k := range Kinds {
		fmt.Fprintf(&b, "| %s | %d |\n", k, events[k])
	}
	b.WriteString("\n## Requests\n\n| outcome | count |\n| --- | --- |\n")
	for _, k := range slices.Sorted(maps.Keys(outcomes)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, outcomes[k])
	}
	b.WriteString("\n## Violations by invariant\n\n| invariant | violations | of which known | seeds |\n| --- | --- | --- | --- |\n")
	for i := 1; i <= numInvariants; i++ {
		c := byInv[i]
		fmt.Fprintf(&b, "| %d %s | %d | %d | %s |\n", i, InvariantNames[i], c[0], c[1], seedList(seedsByInv[i]))
	}
	b.WriteString("\n## Seeds\n\n| seed | wall | requests | events | spent accounts (attempts on them) | violations (known) |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rep.Results {
		known := 0
		for _, v := range r.Violations {
			if v.Known != "" {
				known++
			}
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %d | %s | %d (%d) |\n", r.Seed, r.Elapsed.Round(100*time.Millisecond), len(r.Record.Requests), len(r.Record.Applied),
			r.spentTries(), len(r.Violations), known)
	}
	for seed, e := range rep.Errors {
		fmt.Fprintf(&b, "\nSeed %d could not run: %s\n", seed, e)
	}
	for _, r := range rep.Results {
		if r.Timeline == "" {
			continue
		}
		fmt.Fprintf(&b, "\n## Seed %d\n\n```\n%s```\n", r.Seed, r.Timeline)
	}
	return b.String()
}

func seedList(seeds []uint64) string {
	var parts []string
	for i, s := range seeds {
		if i == 20 {
			parts = append(parts, fmt.Sprintf("… %d more", len(seeds)-20))
			break
		}
		parts = append(parts, fmt.Sprint(s))
	}
	return strings.Join(parts, ", ")
}

// ParseSeeds reads a seed list: "7", "1-100", "1-10,42".
func ParseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		var a, b uint64
		if _, err := fmt.Sscan(lo, &a); err != nil {
			return nil, fmt.Errorf("seeds: %q is not a seed or a range like 1-100", part)
		}
		b = a
		if isRange {
			if _, err := fmt.Sscan(hi, &b); err != nil || b < a {
				return nil, fmt.Errorf("seeds: %q is not a range like 1-100", part)
			}
		}
		if b-a >= 100_000 {
			return nil, fmt.Errorf("seeds: %q is too many", part)
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}
