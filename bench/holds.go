package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// The hold scenarios (weir holds): agents that never retry run streaming
// turns through a running weir whose upstream is its simulator, while the
// simulator's accounts are made to fail, and each turn's latency is
// measured from the agent's side, in real time. A hold that ends long
// after capacity came back shows here as a slow turn.

// HoldsConfig says where the weir under test is and what to run.
type HoldsConfig struct {
	// DataplaneURL, SimulatorURL and Key reach the weir under test (weir
	// dev --simulate writes them to dev.json).
	DataplaneURL, SimulatorURL, Key string
	// Accounts are the simulator's accounts that serve Model.
	Accounts []string
	Model    string
	// Agents run Turns turns each, one after another, all agents at once.
	Agents, Turns int
	// Runs is how often each scenario is run.
	Runs int
	// Storm is how long the storm scenario's storm lasts.
	Storm time.Duration
	// Timeout bounds one turn.
	Timeout time.Duration
}

// Validate names the first bad field.
func (c HoldsConfig) Validate() error {
	switch {
	case c.DataplaneURL == "" || c.SimulatorURL == "" || c.Key == "":
		return errors.New("DataplaneURL, SimulatorURL and Key are required (a running weir dev --simulate)")
	case len(c.Accounts) < 2:
		return errors.New("Accounts: at least two simulator accounts serving the model")
	case c.Agents < 1 || c.Turns < 1 || c.Runs < 1:
		return errors.New("Agents, Turns and Runs must be at least 1")
	case c.Storm <= 0 || c.Timeout <= 0:
		return errors.New("Storm and Timeout must be positive")
	}
	return nil
}

// TurnResult is one agent turn as the agent saw it.
type TurnResult struct {
	Status int
	OK     bool // 200 and a whole stream
	Start  time.Time
	Took   time.Duration
	Err    string
}

// ScenarioRun is one run of a scenario.
type ScenarioRun struct {
	Scenario string
	Turns    []TurnResult
	// Upstream is what the simulator saw: attempts, and those it failed.
	Upstream, Failed int
	// AfterCapacity is, for each turn that was waiting when the storm
	// ended (none for the other scenarios), how long after it the turn was
	// served.
	AfterCapacity []time.Duration
}

// Durations of the turns, sorted.
func (r ScenarioRun) sortedTook() []time.Duration {
	d := make([]time.Duration, 0, len(r.Turns))
	for _, t := range r.Turns {
		d = append(d, t.Took)
	}
	slices.Sort(d)
	return d
}

func (r ScenarioRun) ok() int {
	n := 0
	for _, t := range r.Turns {
		if t.OK {
			n++
		}
	}
	return n
}

// RunHolds runs every scenario cfg.Runs times.
func RunHolds(ctx context.Context, cfg HoldsConfig) ([]ScenarioRun, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &holds{cfg: cfg, c: &http.Client{Timeout: cfg.Timeout}}
	var out []ScenarioRun
	type scenario struct {
		name string
		run  func(context.Context) (ScenarioRun, error)
	}
	var scenarios []scenario
	// Routing decides which account the agents meet first: each account
	// in turn is the overloaded one.
	for _, a := range cfg.Accounts {
		scenarios = append(scenarios, scenario{"only " + a + " overloaded (529 x5)", h.overloaded(a)})
	}
	scenarios = append(scenarios, scenario{"a blip on every account (529 x3 each)", h.blip},
		scenario{fmt.Sprintf("a %v storm on every account", cfg.Storm), h.storm})
	for _, sc := range scenarios {
		for range cfg.Runs {
			if err := h.reset(ctx); err != nil {
				return out, err
			}
			r, err := sc.run(ctx)
			r.Scenario = sc.name
			if err != nil {
				return out, fmt.Errorf("%s: %w", sc.name, err)
			}
			out = append(out, r)
		}
	}
	return out, h.reset(ctx)
}

type holds struct {
	cfg HoldsConfig
	c   *http.Client
}

// overloaded fails one account, the others healthy.
func (h *holds) overloaded(account string) func(context.Context) (ScenarioRun, error) {
	return func(ctx context.Context) (ScenarioRun, error) {
		if err := h.fault(ctx, account, sim.Fault{Kind: sim.FaultOverloaded, Times: 5}); err != nil {
			return ScenarioRun{}, err
		}
		return h.agents(ctx)
	}
}

func (h *holds) blip(ctx context.Context) (ScenarioRun, error) {
	for _, a := range h.cfg.Accounts {
		if err := h.fault(ctx, a, sim.Fault{Kind: sim.FaultOverloaded, Times: 3}); err != nil {
			return ScenarioRun{}, err
		}
	}
	return h.agents(ctx)
}

// storm fails every account until cfg.Storm has passed, then clears the
// faults: the agents' turns started in it wait, and are measured from its
// end.
func (h *holds) storm(ctx context.Context) (ScenarioRun, error) {
	for _, a := range h.cfg.Accounts {
		if err := h.fault(ctx, a, sim.Fault{Kind: sim.FaultOverloaded, Times: -1}); err != nil {
			return ScenarioRun{}, err
		}
	}
	back := time.Now().Add(h.cfg.Storm)
	var (
		up, failed int
		ended      = make(chan error, 1)
	)
	go func() {
		t := time.NewTimer(time.Until(back))
		defer t.Stop()
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
			return
		case <-t.C:
		}
		// The storm's attempts are counted before the reset clears them.
		atts, err := h.attempts(ctx)
		if err == nil {
			up, failed = count(atts)
			err = h.reset(ctx)
		}
		ended <- err
	}()
	r, err := h.agents(ctx)
	if serr := <-ended; err == nil {
		err = serr
	}
	r.Upstream += up
	r.Failed += failed
	for _, t := range r.Turns {
		if t.Start.Before(back) {
			r.AfterCapacity = append(r.AfterCapacity, t.Start.Add(t.Took).Sub(back))
		}
	}
	return r, err
}

// agents runs the agents' turns and counts the upstream attempts.
func (h *holds) agents(ctx context.Context) (ScenarioRun, error) {
	var (
		mu sync.Mutex
		r  ScenarioRun
		wg sync.WaitGroup
	)
	for a := range h.cfg.Agents {
		wg.Go(func() {
			session := fmt.Sprintf("holds-agent-%d-%d", a, time.Now().UnixNano())
			for range h.cfg.Turns {
				t := h.turn(ctx, session)
				mu.Lock()
				r.Turns = append(r.Turns, t)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	atts, err := h.attempts(ctx)
	if err != nil {
		return r, err
	}
	r.Upstream, r.Failed = count(atts)
	return r, ctx.Err()
}

func count(atts []sim.Attempt) (up, failed int) {
	for _, a := range atts {
		if !strings.HasPrefix(a.Path, "/v1/messages") {
			continue
		}
		up++
		if a.Status != http.StatusOK {
			failed++
		}
	}
	return up, failed
}

// turn is one streaming Messages request, as an agent that never retries
// sends it: the turn is good when the stream ends with message_stop.
func (h *holds) turn(ctx context.Context, session string) TurnResult {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":256,"stream":true,"messages":[{"role":"user","content":"hello from %s"}]}`, h.cfg.Model, session)
	start := time.Now()
	res := TurnResult{Start: start}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.cfg.DataplaneURL+"/v1/messages", strings.NewReader(body))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("X-Api-Key", h.cfg.Key)
	req.Header.Set("X-Claude-Code-Session-Id", session)
	resp, err := h.c.Do(req)
	if err != nil {
		res.Took, res.Err = time.Since(start), err.Error()
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	stopped := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if bytes.Equal(sc.Bytes(), []byte("event: message_stop")) {
			stopped = true
		}
	}
	res.Took = time.Since(start)
	res.OK = resp.StatusCode == http.StatusOK && stopped && sc.Err() == nil
	if !res.OK && res.Err == "" {
		res.Err = fmt.Sprintf("status %d, stream whole %t", resp.StatusCode, stopped)
	}
	return res
}

func (h *holds) fault(ctx context.Context, account string, f sim.Fault) error {
	b, _ := json.Marshal([]sim.Fault{f})
	return h.control(ctx, http.MethodPost, "/_sim/accounts/"+account+"/faults", b, nil)
}

func (h *holds) reset(ctx context.Context) error {
	return h.control(ctx, http.MethodPost, "/_sim/reset", nil, nil)
}

func (h *holds) attempts(ctx context.Context) ([]sim.Attempt, error) {
	var atts []sim.Attempt
	return atts, h.control(ctx, http.MethodGet, "/_sim/attempts", nil, &atts)
}

// control calls the simulator's control endpoint.
func (h *holds) control(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, h.cfg.SimulatorURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return fmt.Errorf("simulator %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("simulator %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// HoldsMarkdown is the runs' report: one row per run.
func HoldsMarkdown(cfg HoldsConfig, runs []ScenarioRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d agents x %d streaming turns, clients that never retry, %d run(s) of each scenario, accounts %s, model %s.\n\n",
		cfg.Agents, cfg.Turns, cfg.Runs, strings.Join(cfg.Accounts, ", "), cfg.Model)
	b.WriteString("| scenario | ok | median turn | slowest turn | served after capacity returned (max) | upstream attempts (failed) |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range runs {
		took := r.sortedTook()
		after := "—"
		if len(r.AfterCapacity) > 0 {
			after = fmt.Sprintf("%v (%d turns)", slices.Max(r.AfterCapacity).Round(10*time.Millisecond), len(r.AfterCapacity))
		}
		fmt.Fprintf(&b, "| %s | %d/%d | %v | %v | %s | %d (%d) |\n", r.Scenario, r.ok(), len(r.Turns),
			took[len(took)/2].Round(10*time.Millisecond), took[len(took)-1].Round(10*time.Millisecond), after, r.Upstream, r.Failed)
	}
	return b.String()
}
