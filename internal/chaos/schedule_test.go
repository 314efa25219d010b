package chaos

import (
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"
)

func testScheduleConfig() ScheduleConfig {
	c := Config{Duration: 15 * time.Second}
	c.defaults()
	return c.scheduleConfig(pool)
}

func TestPlanIsTheSeeds(t *testing.T) {
	t.Parallel()
	c := testScheduleConfig()
	if a, b := Plan(7, c), Plan(7, c); !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 planned twice differently:\n%v\n%v", a, b)
	}
	if a, b := Plan(7, c), Plan(8, c); reflect.DeepEqual(a, b) {
		t.Fatal("seeds 7 and 8 plan the same")
	}
}

// Every seed's schedule keeps the bounds the checks rely on.
func TestPlanBounds(t *testing.T) {
	t.Parallel()
	c := testScheduleConfig()
	kinds := map[Kind]int{}
	for seed := range uint64(300) {
		plan := Plan(seed, c)
		if len(plan) < 4 {
			t.Errorf("seed %d: only %d events", seed, len(plan))
		}
		for i, e := range plan {
			kinds[e.Kind]++
			if e.Kind == Spent {
				continue // the whole run: TestPlanMixedPool
			}
			if e.At < c.Warmup || e.End() > c.Duration-c.Quiet {
				t.Errorf("seed %d: %s outside %v..%v", seed, e, c.Warmup, c.Duration-c.Quiet)
			}
			if (e.Kind == PauseWorker || e.Kind == PauseControlPlane) && e.For > c.MaxPause {
				t.Errorf("seed %d: %s pauses longer than %v", seed, e, c.MaxPause)
			}
			if e.For > c.MaxDown {
				t.Errorf("seed %d: %s lasts longer than %v", seed, e, c.MaxDown)
			}
			if i > 0 && plan[i-1].At > e.At {
				t.Errorf("seed %d: out of order at %d", seed, i)
			}
			// At e's start (where the count of those out can rise), some
			// worker is in.
			workersOut := map[int]bool{}
			for _, o := range plan {
				if (o.Kind == KillWorker || o.Kind == PauseWorker) && o.At <= e.At && e.At < o.End() {
					workersOut[o.Target] = true
				}
			}
			for _, o := range plan {
				if o.At >= e.End() || e.At >= o.End() || o == e || o.Kind == Spent {
					continue
				}
				if targetKey(o) == targetKey(e) {
					t.Errorf("seed %d: %s and %s overlap on one target", seed, e, o)
				}
				if o.Kind == Upstream && e.Kind == Upstream && pool[o.Target].Anthropic == pool[e.Target].Anthropic {
					t.Errorf("seed %d: %s and %s: two accounts of a provider misbehave together", seed, e, o)
				}
			}
			if len(workersOut) >= c.Workers {
				t.Errorf("seed %d: every worker out at %s", seed, e)
			}
		}
	}
	for _, k := range Kinds {
		if kinds[k] == 0 {
			t.Errorf("no seed of 300 schedules %s", k)
		}
	}
}

// A good share of seeds spend one or two Anthropic accounts for the whole
// run, never more than half of them; no other fault targets a spent
// account, and outside storms some Anthropic account is neither spent nor
// misbehaving.
func TestPlanMixedPool(t *testing.T) {
	t.Parallel()
	c := testScheduleConfig()
	const seeds = 300
	bySpent := map[int]int{}
	for seed := range uint64(seeds) {
		plan := Plan(seed, c)
		spent := map[int]bool{}
		for _, e := range plan {
			if e.Kind != Spent {
				continue
			}
			if e.At != 0 || e.For != c.Duration || !pool[e.Target].Anthropic || spent[e.Target] {
				t.Errorf("seed %d: %s: want a distinct Anthropic account spent from 0 for %v", seed, e, c.Duration)
			}
			if (e.Claim != "five_hour" && e.Claim != "seven_day") || e.ResetIn < time.Hour {
				t.Errorf("seed %d: %s: want five_hour or seven_day resetting hours away", seed, e)
			}
			spent[e.Target] = true
		}
		bySpent[len(spent)]++
		if len(spent) > 2 {
			t.Errorf("seed %d: %d of 4 Anthropic accounts spent", seed, len(spent))
		}
		for _, e := range plan {
			if e.Kind == Upstream && spent[e.Target] {
				t.Errorf("seed %d: %s targets a spent account", seed, e)
			}
			// At each start outside a storm, some Anthropic account serves.
			out := maps.Clone(spent)
			storm := false
			for _, o := range plan {
				if o.At <= e.At && e.At < o.End() {
					storm = storm || o.Kind == Storm
					if o.Kind == Upstream && pool[o.Target].Anthropic {
						out[o.Target] = true
					}
				}
			}
			if !storm && len(out) >= 4 {
				t.Errorf("seed %d: every Anthropic account out at %s", seed, e)
			}
		}
	}
	if bySpent[1] < seeds*35/100 || bySpent[2] < seeds*10/100 || bySpent[0] < seeds*30/100 {
		t.Errorf("seeds by spent accounts %v of %d: want about 45%% with one, 15%% with two", bySpent, seeds)
	}
}

func targetKey(e Event) string {
	switch e.Kind {
	case KillWorker, PauseWorker:
		return fmt.Sprint("worker", e.Target)
	case KillControlPlane, PauseControlPlane:
		return fmt.Sprint("cp", e.Target)
	case StopPostgres, CutPostgres, BlackholePostgres:
		return "postgres"
	case CutControlPlanes, BlackholeControlPlanes:
		return "cpproxy"
	case Upstream:
		return fmt.Sprint("account", e.Target)
	}
	return string(e.Kind)
}

func TestParseSeeds(t *testing.T) {
	t.Parallel()
	got, err := ParseSeeds("1-3,7")
	if err != nil || !reflect.DeepEqual(got, []uint64{1, 2, 3, 7}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "5-2", "1-"} {
		if _, err := ParseSeeds(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
