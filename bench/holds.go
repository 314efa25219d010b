package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// The hold scenarios (weir holds): agents that never retry run streaming
// turns through a running weir whose upstream is its simulator, while the
// simulator's accounts are made to fail, and each turn's latency is
// measured from the agent's side, in real time. A hold that ends long
// after capacity came back shows here as a slow turn.
//
// A scenario must meet the fault it names: one that faults a single
// account raises that account's priority for the run (through the admin
// API, restored after), so that routing tries it first, and every row
// counts each faulted account's attempts and failures in the simulator's
// log. A faulted account that no attempt failed on makes the row say its
// fault was not met, instead of passing.

// HoldsConfig says where the weir under test is and what to run.
type HoldsConfig struct {
	// DataplaneURL, SimulatorURL and Key reach the weir under test (weir
	// dev --simulate writes them to dev.json).
	DataplaneURL, SimulatorURL, Key string
	// ControlplaneURL and AdminToken reach its admin API (dev.json too):
	// scenarios raise the priority of the account they fault and resume
	// the account they spent.
	ControlplaneURL, AdminToken string
	// Accounts are the simulator's accounts that serve Model, by the
	// labels weir knows them by (weir dev names them alike).
	Accounts []string
	Model    string
	// Agents run Turns turns each, one after another, all agents at once.
	Agents, Turns int
	// Runs is how often each scenario is run.
	Runs int
	// Storm is how long the storms last (the storm and mixed-pool
	// scenarios).
	Storm time.Duration
	// Recovery is when the partial-recovery scenario's one account
	// recovers, from the start of the run.
	Recovery time.Duration
	// Timeout bounds one turn.
	Timeout time.Duration
}

// Validate names the first bad field.
func (c HoldsConfig) Validate() error {
	switch {
	case c.DataplaneURL == "" || c.SimulatorURL == "" || c.Key == "":
		return errors.New("DataplaneURL, SimulatorURL and Key are required (a running weir dev --simulate)")
	case c.ControlplaneURL == "" || c.AdminToken == "":
		return errors.New("ControlplaneURL and AdminToken are required (a running weir dev --simulate)")
	case len(c.Accounts) < 2:
		return errors.New("holds: accounts: at least two simulator accounts must serve the model")
	case c.Agents < 1 || c.Turns < 1 || c.Runs < 1:
		return errors.New("holds: agents, turns and runs must be at least 1")
	case c.Storm <= 0 || c.Recovery <= 0 || c.Timeout <= 0:
		return errors.New("holds: storm, recovery and timeout must be positive")
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
	// BodySHA256 is the hex SHA-256 of the turn's body (unique per turn),
	// to find its attempts in the simulator's log.
	BodySHA256 string
}

func (t TurnResult) end() time.Time { return t.Start.Add(t.Took) }

// AccountAttempts is what the simulator saw of one account in a run.
type AccountAttempts struct {
	Account          string
	Attempts, Failed int
}

// ScenarioRun is one run of a scenario.
type ScenarioRun struct {
	Scenario string
	Turns    []TurnResult
	// Upstream is what the simulator saw: attempts, and those it failed.
	Upstream, Failed int
	// Faulted is, for each account the scenario faulted, its attempts and
	// failures.
	Faulted []AccountAttempts
	// Mark names the moment the scenario measures from ("the storm
	// ended"), "" for a scenario that measures the turns that met its
	// fault.
	Mark string
	// Waiting is, for each turn waiting at Mark, how long after it the
	// turn ended, and WaitingOK how many of them were served.
	Waiting   []time.Duration
	WaitingOK int
	// Met is the duration of each turn that had an attempt fail on a
	// faulted account (scenarios without a Mark).
	Met []time.Duration
	// Others are the active Anthropic accounts in weir's pool that are not
	// among HoldsConfig.Accounts: turns may go there, past every fault.
	Others []string
}

// Unmet are the faulted accounts that no attempt failed on: a run with
// any did not exercise all of its fault.
func (r ScenarioRun) Unmet() []string {
	var out []string
	for _, a := range r.Faulted {
		if a.Failed == 0 {
			out = append(out, a.Account)
		}
	}
	return out
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

// scenario is one hold scenario: the faults it queues at start, the
// account it makes routing try first, the account it spends (resumed
// after the run), and the moment it measures from, if any.
type scenario struct {
	name   string
	faults func(start time.Time) map[string][]sim.Fault
	prefer string
	spent  string
	mark   string
	markAt func(start time.Time) time.Time
}

// RunHolds runs every scenario cfg.Runs times.
func RunHolds(ctx context.Context, cfg HoldsConfig) ([]ScenarioRun, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := newHolds(cfg)
	accts, err := h.accountsByLabel(ctx)
	if err != nil {
		return nil, err
	}
	var others []string
	for l, a := range accts {
		if a.GetProvider() == weirv1.Provider_PROVIDER_ANTHROPIC && a.GetState() != weirv1.AccountState_ACCOUNT_STATE_PAUSED &&
			!slices.Contains(cfg.Accounts, l) {
			others = append(others, l)
		}
	}
	slices.Sort(others)
	var out []ScenarioRun
	for _, sc := range h.scenarios(accts) {
		for range cfg.Runs {
			r, err := h.run(ctx, sc, accts)
			r.Scenario, r.Others = sc.name, others
			if err != nil {
				return out, fmt.Errorf("%s: %w", sc.name, err)
			}
			out = append(out, r)
		}
	}
	return out, h.reset(ctx)
}

type holds struct {
	cfg      HoldsConfig
	c        *http.Client
	accounts weirv1connect.AccountServiceClient
}

func newHolds(cfg HoldsConfig) *holds {
	return &holds{cfg: cfg, c: &http.Client{Timeout: cfg.Timeout},
		accounts: weirv1connect.NewAccountServiceClient(rpcclient.HTTPClient(), cfg.ControlplaneURL,
			connect.WithInterceptors(rpcclient.Token(cfg.AdminToken), rpcclient.Actor("weir holds")))}
}

// accountsByLabel reads weir's view of cfg.Accounts; each must exist.
func (h *holds) accountsByLabel(ctx context.Context) (map[string]*weirv1.Account, error) {
	resp, err := h.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	byLabel := map[string]*weirv1.Account{}
	for _, a := range resp.Msg.GetAccounts() {
		byLabel[a.GetLabel()] = a
	}
	for _, l := range h.cfg.Accounts {
		if byLabel[l] == nil {
			return nil, fmt.Errorf("no account labelled %q in weir (Accounts name weir's labels, which weir dev gives the simulator's accounts)", l)
		}
	}
	return byLabel, nil
}

// scenarios are the hold scenarios over cfg.Accounts.
func (h *holds) scenarios(accts map[string]*weirv1.Account) []scenario {
	all := h.cfg.Accounts
	every := func(f sim.Fault) func(time.Time) map[string][]sim.Fault {
		return func(time.Time) map[string][]sim.Fault {
			m := map[string][]sim.Fault{}
			for _, a := range all {
				m[a] = []sim.Fault{f}
			}
			return m
		}
	}
	var out []scenario
	// Each account in turn is the overloaded one, and routing tries it
	// first: the agents meet its 529s and fail over.
	for _, a := range all {
		out = append(out, scenario{name: "only " + a + " overloaded (529 x5), tried first", prefer: a,
			faults: func(time.Time) map[string][]sim.Fault {
				return map[string][]sim.Fault{a: {{Kind: sim.FaultOverloaded, Times: 5}}}
			}})
	}
	// A blip on every account: each answers 529 for a short while from
	// its first attempt, 2 s per account in the pool, long enough for an
	// agent that meets one (and retries it after 1 s) to fail over into
	// the next one's before the first is over, until every account has
	// had its own.
	blip := time.Duration(len(all)) * 2 * time.Second
	out = append(out, scenario{name: fmt.Sprintf("a blip on every account (529 for %v from its first attempt)", blip),
		faults: every(sim.Fault{Kind: sim.FaultOverloaded, For: sim.Duration(blip)})})

	storm := h.cfg.Storm
	out = append(out, scenario{name: fmt.Sprintf("a %v storm on every account", storm), mark: "the storm ended",
		markAt: func(start time.Time) time.Time { return start.Add(storm) },
		faults: func(start time.Time) map[string][]sim.Fault {
			return every(sim.Fault{Kind: sim.FaultOverloaded, Until: start.Add(storm)})(start)
		}})

	// The mixed pool: one subscription out of its 5-hour window for the
	// whole run (tried first, so that the agents meet it), a storm on the
	// others meanwhile.
	spent := spendable(all, accts)
	out = append(out, scenario{name: fmt.Sprintf("mixed pool: %s spent (5-hour window), a %v storm on the others", spent, storm),
		prefer: spent, spent: spent, mark: "the storm ended",
		markAt: func(start time.Time) time.Time { return start.Add(storm) },
		faults: func(start time.Time) map[string][]sim.Fault {
			m := map[string][]sim.Fault{spent: {{Kind: sim.FaultRateLimit, Times: -1,
				Unified: &sim.UnifiedRejection{Claim: "five_hour", ResetIn: sim.Duration(3 * time.Hour)}}}}
			for _, a := range all {
				if a != spent {
					m[a] = []sim.Fault{{Kind: sim.FaultOverloaded, Until: start.Add(storm)}}
				}
			}
			return m
		}})

	// Partial recovery: every account overloaded, one recovers.
	back := all[len(all)-1]
	rec := h.cfg.Recovery
	out = append(out, scenario{name: fmt.Sprintf("partial recovery: every account overloaded, %s recovers after %v", back, rec),
		mark: back + " recovered", markAt: func(start time.Time) time.Time { return start.Add(rec) },
		faults: func(start time.Time) map[string][]sim.Fault {
			m := every(sim.Fault{Kind: sim.FaultOverloaded, Times: -1})(start)
			m[back] = []sim.Fault{{Kind: sim.FaultOverloaded, Until: start.Add(rec)}}
			return m
		}})
	return out
}

// spendable is the account the mixed pool spends: the first subscription
// (OAuth) account, whose 5-hour window a spent one is, else the first.
func spendable(labels []string, accts map[string]*weirv1.Account) string {
	for _, l := range labels {
		if accts[l].GetAuthKind() == weirv1.AuthKind_AUTH_KIND_OAUTH {
			return l
		}
	}
	return labels[0]
}

// run runs a scenario once: it clears the simulator, queues the faults,
// makes routing try sc.prefer first, runs the agents, and reads what the
// simulator saw. Afterwards the faults are cleared, the spent account
// resumed and the priority restored.
func (h *holds) run(ctx context.Context, sc scenario, accts map[string]*weirv1.Account) (r ScenarioRun, err error) {
	if err := h.reset(ctx); err != nil {
		return r, err
	}
	if sc.prefer != "" {
		// From a clean account: an overload a run before would have
		// routing try the others first for a few seconds.
		if err := h.resume(accts[sc.prefer].GetId()); err != nil {
			return r, err
		}
		restore, err := h.preferAccount(ctx, accts, sc.prefer)
		if err != nil {
			return r, err
		}
		defer func() { err = errors.Join(err, restore()) }()
	}
	if sc.spent != "" {
		defer func() { err = errors.Join(err, h.resume(accts[sc.spent].GetId())) }()
	}
	start := time.Now()
	faults := sc.faults(start)
	for _, a := range h.cfg.Accounts {
		for _, f := range faults[a] {
			if err := h.fault(ctx, a, f); err != nil {
				return r, err
			}
		}
	}
	r.Turns = h.agents(ctx)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	atts, err := h.attempts(ctx)
	if err != nil {
		return r, err
	}
	r.Upstream, r.Failed = count(atts)
	failedOn := map[string]bool{} // bodies with an attempt failed on a faulted account
	for _, a := range h.cfg.Accounts {
		if _, ok := faults[a]; !ok {
			continue
		}
		aa := AccountAttempts{Account: a}
		for _, at := range atts {
			if at.Account == a && isMessages(at) {
				aa.Attempts++
				if at.Status != http.StatusOK {
					aa.Failed++
					failedOn[at.BodySHA256] = true
				}
			}
		}
		r.Faulted = append(r.Faulted, aa)
	}
	if sc.mark != "" {
		r.Mark = sc.mark
		at := sc.markAt(start)
		for _, t := range r.Turns {
			if t.Start.Before(at) && t.end().After(at) {
				r.Waiting = append(r.Waiting, t.end().Sub(at))
				if t.OK {
					r.WaitingOK++
				}
			}
		}
		return r, h.reset(ctx)
	}
	for _, t := range r.Turns {
		if failedOn[t.BodySHA256] {
			r.Met = append(r.Met, t.Took)
		}
	}
	return r, h.reset(ctx)
}

// preferAccount makes routing try label first: the top priority in the
// pool, above every other account's. restore puts the old one back.
func (h *holds) preferAccount(ctx context.Context, accts map[string]*weirv1.Account, label string) (restore func() error, err error) {
	top := int32(0)
	for _, a := range accts {
		top = max(top, a.GetPriority())
	}
	a := accts[label]
	set := func(ctx context.Context, p int32) error {
		_, err := h.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{
			Id: a.GetId(), Priority: p, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"priority"}}}))
		if err != nil {
			return fmt.Errorf("set %s's priority: %w", label, err)
		}
		return nil
	}
	if err := set(ctx, top+100); err != nil {
		return nil, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return set(ctx, a.GetPriority())
	}, nil
}

// resume clears an account's cooldowns (a spent account's lasts hours).
func (h *holds) resume(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.accounts.ResumeAccount(ctx, connect.NewRequest(&weirv1.ResumeAccountRequest{Id: id})); err != nil {
		return fmt.Errorf("resume account: %w", err)
	}
	return nil
}

// agents runs the agents' turns.
func (h *holds) agents(ctx context.Context) []TurnResult {
	var (
		mu    sync.Mutex
		turns []TurnResult
		wg    sync.WaitGroup
	)
	for a := range h.cfg.Agents {
		wg.Go(func() {
			session := fmt.Sprintf("holds-agent-%d-%d", a, time.Now().UnixNano())
			for i := range h.cfg.Turns {
				t := h.turn(ctx, session, i)
				mu.Lock()
				turns = append(turns, t)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return turns
}

func isMessages(a sim.Attempt) bool { return strings.HasPrefix(a.Path, "/v1/messages") }

func count(atts []sim.Attempt) (up, failed int) {
	for _, a := range atts {
		if !isMessages(a) {
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
func (h *holds) turn(ctx context.Context, session string, n int) TurnResult {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":256,"stream":true,"messages":[{"role":"user","content":"hello from %s, turn %d"}]}`, h.cfg.Model, session, n)
	sum := sha256.Sum256([]byte(body))
	start := time.Now()
	res := TurnResult{Start: start, BodySHA256: hex.EncodeToString(sum[:])}
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

// HoldsMarkdown is the runs' report: one row per run. "fault met" shows
// each faulted account's failed and all attempts, or that the run did not
// meet its fault; "measured" is the slowest of the turns that met the
// fault, or of the turns waiting at the scenario's mark after it.
func HoldsMarkdown(cfg HoldsConfig, runs []ScenarioRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d agents x %d streaming turns, clients that never retry, %d run(s) of each scenario, accounts %s, model %s.\n\n",
		cfg.Agents, cfg.Turns, cfg.Runs, strings.Join(cfg.Accounts, ", "), cfg.Model)
	if len(runs) > 0 && len(runs[0].Others) > 0 {
		fmt.Fprintf(&b, "Not faulted, yet in weir's pool (turns may go there, past every fault; pause them to test the accounts above alone): %s.\n\n",
			strings.Join(runs[0].Others, ", "))
	}
	b.WriteString("| scenario | fault met (failed/attempts) | ok | median turn | slowest turn | measured | upstream attempts (failed) |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	for _, r := range runs {
		took := r.sortedTook()
		median, slowest := "-", "-"
		if len(took) > 0 {
			median, slowest = round(took[len(took)/2]).String(), round(took[len(took)-1]).String()
		}
		fmt.Fprintf(&b, "| %s | %s | %d/%d | %s | %s | %s | %d (%d) |\n", r.Scenario, faultMet(r), r.ok(), len(r.Turns),
			median, slowest, measured(r), r.Upstream, r.Failed)
	}
	return b.String()
}

// faultMet is the row's "fault met" cell.
func faultMet(r ScenarioRun) string {
	parts := make([]string, 0, len(r.Faulted))
	for _, a := range r.Faulted {
		parts = append(parts, fmt.Sprintf("%s %d/%d", a.Account, a.Failed, a.Attempts))
	}
	cell := strings.Join(parts, ", ")
	if unmet := r.Unmet(); len(unmet) > 0 {
		return fmt.Sprintf("**NOT MET** on %s: this run did not test that fault (%s)", strings.Join(unmet, ", "), cell)
	}
	return "yes: " + cell
}

// measured is the row's "measured" cell.
func measured(r ScenarioRun) string {
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	if r.Mark != "" {
		if len(r.Waiting) == 0 {
			return "no turn was waiting when " + r.Mark
		}
		return fmt.Sprintf("ended ≤ %v after %s (%d turns waiting, %d served)", round(slices.Max(r.Waiting)), r.Mark, len(r.Waiting), r.WaitingOK)
	}
	if len(r.Met) == 0 {
		return "no turn met the fault"
	}
	return fmt.Sprintf("%d turns met the fault, the slowest %v", len(r.Met), round(slices.Max(r.Met)))
}
