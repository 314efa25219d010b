package sim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Model families that can have a weekly window of their own. A request's
// family is "opus" when its model contains "opus", "sonnet" when it
// contains "sonnet".
const (
	FamilyOpus   = "opus"
	FamilySonnet = "sonnet"
)

var families = []string{FamilyOpus, FamilySonnet}

// Window periods: a window that resets starts over one period later.
const (
	fiveHourPeriod = 5 * time.Hour
	sevenDayPeriod = 7 * 24 * time.Hour
)

// defaultScopedHeader is the header infix of a family window:
// anthropic-ratelimit-unified-7d_oi-{status,utilization,reset}.
const defaultScopedHeader = "7d_oi"

// headerUtilizationCap is where the unified headers saturate; the usage
// endpoint goes on to 100.
const headerUtilizationCap = 99 // percent

// Windows are an OAuth account's usage windows. Each is optional; an
// absent window is null in the usage endpoint and absent from the headers.
type Windows struct {
	FiveHour *Window `json:"five_hour,omitempty"`
	SevenDay *Window `json:"seven_day,omitempty"`
	// Families are weekly windows scoped to a model family ("opus",
	// "sonnet"). They fill only with requests of their family, and a full
	// one rejects only those.
	Families map[string]FamilyWindow `json:"families,omitempty"`
	// Overage is reported in the overage headers and the usage endpoint's
	// extra_usage; it does not let requests past a full window.
	Overage *Overage `json:"overage,omitempty"`
}

// Window is a token budget that empties at its reset, after which the
// next reset is one period (5 hours or 7 days) later.
type Window struct {
	// Limit is the window's budget in tokens (input + output).
	Limit int64 `json:"limit"`
	// Used is how much of it is spent when the script is loaded.
	Used int64 `json:"used"`
	// ResetsAt is the window's next reset. A time already past when the
	// script is loaded means the window has reset since: it starts empty
	// at the next reset on the period's schedule.
	ResetsAt time.Time `json:"resets_at,omitzero"`
	// ResetIn is the next reset relative to the sim clock when the script
	// is loaded. With neither, the simulator's regular reset applies (on
	// the hour, 2 hours ahead for five_hour, 72 hours ahead otherwise).
	ResetIn Duration `json:"reset_in,omitempty"`
}

// FamilyWindow is a weekly window scoped to one model family.
type FamilyWindow struct {
	Window
	// Claim is the representative claim when this window rejects:
	// seven_day_opus, seven_day_sonnet or seven_day_overage_included.
	// Default: seven_day_<family>.
	Claim string `json:"claim,omitempty"`
	// Header is the header infix of the window's status, utilization and
	// reset headers. Default: "7d_oi".
	Header string `json:"header,omitempty"`
}

// Overage is the account's extra-usage state.
type Overage struct {
	// Status is the overage-status header: allowed, allowed_warning or
	// rejected. Default: rejected. extra_usage.is_enabled is true unless
	// it is rejected.
	Status string `json:"status,omitempty"`
	// DisabledReason is the overage-disabled-reason header, such as
	// org_level_disabled or out_of_credits; empty sends none.
	DisabledReason string `json:"disabled_reason,omitempty"`
}

var overageStatuses = []string{"allowed", "allowed_warning", "rejected"}

// familyClaims are the claims a family window may use.
var familyClaims = []string{ClaimSevenDayOpus, ClaimSevenDaySonnet, ClaimSevenDayOverageIncluded}

// Grant is one banked rate-limit reset of an account.
type Grant struct {
	ID      string `json:"id"`
	Program string `json:"program,omitempty"`
	// ExpiresAt or ExpiresIn (relative to the sim clock when the script is
	// loaded) is when the grant lapses; with neither it never does.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	ExpiresIn Duration  `json:"expires_in,omitempty"`
}

// validateOAuthExtras reports every problem in the opt-in fields of an
// account, each prefixed by field.
func validateOAuthExtras(field string, a AccountScript) error {
	var errs []error
	oauth := a.kind() == KindOAuth
	chatgpt := a.kind() == KindChatGPT
	need := func(name string, set bool) {
		if set && !oauth {
			errs = append(errs, fmt.Errorf("%s.%s: only valid for %s accounts", field, name, KindOAuth))
		}
	}
	needEither := func(name string, set bool) {
		if set && !oauth && !chatgpt {
			errs = append(errs, fmt.Errorf("%s.%s: only valid for %s and %s accounts", field, name, KindOAuth, KindChatGPT))
		}
	}
	needEither("windows", a.Windows != nil)
	needEither("refresh_token", a.RefreshToken != "")
	needEither("access_expires_in", a.AccessExpiresIn != 0)
	needEither("usage_reads_per_10m", a.UsageReadsPer10m != 0)
	need("grants", len(a.Grants) > 0)
	if chatgpt && a.Windows != nil {
		need("windows.families", len(a.Windows.Families) > 0)
		need("windows.overage", a.Windows.Overage != nil)
	}
	if a.ChatGPTAccountID != "" {
		if !chatgpt {
			errs = append(errs, fmt.Errorf("%s.chatgpt_account_id: only valid for %s accounts", field, KindChatGPT))
		} else if !wellFormedCredential(a.ChatGPTAccountID) || len(a.ChatGPTAccountID) > 200 {
			errs = append(errs, fmt.Errorf("%s.chatgpt_account_id: %q is not a well-formed id", field, a.ChatGPTAccountID))
		}
	}

	if a.RefreshToken != "" && !wellFormedCredential(a.RefreshToken) {
		errs = append(errs, fmt.Errorf("%s.refresh_token: not a well-formed token", field))
	}
	if a.RefreshToken != "" && a.RefreshToken == a.Credential {
		errs = append(errs, fmt.Errorf("%s.refresh_token: must differ from the credential", field))
	}
	if a.AccessExpiresIn < 0 {
		errs = append(errs, fmt.Errorf("%s.access_expires_in: %v is negative", field, time.Duration(a.AccessExpiresIn)))
	}
	if a.UsageReadsPer10m < -1 {
		errs = append(errs, fmt.Errorf("%s.usage_reads_per_10m: %d is invalid (0 means 4, -1 means no limit)", field, a.UsageReadsPer10m))
	}
	if w := a.Windows; w != nil {
		errs = append(errs, validateWindow(field+".windows.five_hour", w.FiveHour))
		errs = append(errs, validateWindow(field+".windows.seven_day", w.SevenDay))
		for _, fam := range slices.Sorted(maps.Keys(w.Families)) {
			fw := w.Families[fam]
			ff := field + ".windows.families." + fam
			if !slices.Contains(families, fam) {
				errs = append(errs, fmt.Errorf("%s: unknown family %q (want one of %s)", ff, fam, strings.Join(families, ", ")))
			}
			errs = append(errs, validateWindow(ff, &fw.Window))
			if fw.Claim != "" && !slices.Contains(familyClaims, fw.Claim) {
				errs = append(errs, fmt.Errorf("%s.claim: %q is not a family claim (want one of %s)", ff, fw.Claim, strings.Join(familyClaims, ", ")))
			}
			if fw.Header != "" && (!validHeaderInfix(fw.Header) || fw.Header == "5h" || fw.Header == "7d" || fw.Header == "overage") {
				errs = append(errs, fmt.Errorf("%s.header: %q is not a scoped header infix (such as 7d_oi)", ff, fw.Header))
			}
		}
		if o := w.Overage; o != nil {
			if o.Status != "" && !slices.Contains(overageStatuses, o.Status) {
				errs = append(errs, fmt.Errorf("%s.windows.overage.status: %q (want one of %s)", field, o.Status, strings.Join(overageStatuses, ", ")))
			}
			if o.DisabledReason != "" && !validHeaderInfix(o.DisabledReason) {
				errs = append(errs, fmt.Errorf("%s.windows.overage.disabled_reason: %q is not a reason such as out_of_credits", field, o.DisabledReason))
			}
		}
	}
	ids := map[string]int{}
	for i, g := range a.Grants {
		gf := fmt.Sprintf("%s.grants[%d]", field, i)
		if g.ID == "" {
			errs = append(errs, fmt.Errorf("%s.id: required", gf))
		} else if j, dup := ids[g.ID]; dup {
			errs = append(errs, fmt.Errorf("%s.id: %q already used by grants[%d]", gf, g.ID, j))
		} else {
			ids[g.ID] = i
		}
		if !g.ExpiresAt.IsZero() && g.ExpiresIn != 0 {
			errs = append(errs, fmt.Errorf("%s: set expires_at or expires_in, not both", gf))
		}
		if g.ExpiresIn < 0 {
			errs = append(errs, fmt.Errorf("%s.expires_in: %v is negative", gf, time.Duration(g.ExpiresIn)))
		}
	}
	return errors.Join(errs...)
}

func validateWindow(field string, w *Window) error {
	if w == nil {
		return nil
	}
	var errs []error
	if w.Limit <= 0 {
		errs = append(errs, fmt.Errorf("%s.limit: %d must be positive", field, w.Limit))
	}
	if w.Used < 0 {
		errs = append(errs, fmt.Errorf("%s.used: %d is negative", field, w.Used))
	}
	if !w.ResetsAt.IsZero() && w.ResetIn != 0 {
		errs = append(errs, fmt.Errorf("%s: set resets_at or reset_in, not both", field))
	}
	if w.ResetIn < 0 {
		errs = append(errs, fmt.Errorf("%s.reset_in: %v is negative", field, time.Duration(w.ResetIn)))
	}
	return errors.Join(errs...)
}

// validHeaderInfix: lower-case letters, digits and '_'.
func validHeaderInfix(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// familyOf is the model family whose window a request for model fills.
func familyOf(model string) string {
	m := strings.ToLower(model)
	for _, f := range families {
		if strings.Contains(m, f) {
			return f
		}
	}
	return ""
}

// liveWindow is one window's running state. Guarded by Server.mu.
type liveWindow struct {
	key    string // header infix
	claim  string
	period time.Duration
	limit  int64
	used   int64
	reset  time.Time
}

// liveWindows is an account's running windows. Guarded by Server.mu.
type liveWindows struct {
	fiveHour *liveWindow
	sevenDay *liveWindow
	families map[string]*liveWindow
	overage  *Overage
}

func newLiveWindows(ws *Windows, now time.Time) *liveWindows {
	if ws == nil {
		return nil
	}
	lws := &liveWindows{families: map[string]*liveWindow{}}
	if ws.FiveHour != nil {
		lws.fiveHour = newLiveWindow(*ws.FiveHour, "5h", ClaimFiveHour, fiveHourPeriod, fiveHourReset(now), now)
	}
	if ws.SevenDay != nil {
		lws.sevenDay = newLiveWindow(*ws.SevenDay, "7d", ClaimSevenDay, sevenDayPeriod, sevenDayReset(now), now)
	}
	for fam, fw := range ws.Families {
		claim, key := fw.Claim, fw.Header
		if claim == "" {
			claim = "seven_day_" + fam
		}
		if key == "" {
			key = defaultScopedHeader
		}
		lws.families[fam] = newLiveWindow(fw.Window, key, claim, sevenDayPeriod, sevenDayReset(now), now)
	}
	if ws.Overage != nil {
		o := *ws.Overage
		if o.Status == "" {
			o.Status = "rejected"
		}
		lws.overage = &o
	}
	return lws
}

func newLiveWindow(w Window, key, claim string, period time.Duration, regular, now time.Time) *liveWindow {
	lw := &liveWindow{key: key, claim: claim, period: period, limit: w.Limit, used: w.Used}
	switch {
	case !w.ResetsAt.IsZero():
		lw.reset = w.ResetsAt
	case w.ResetIn > 0:
		lw.reset = now.Add(time.Duration(w.ResetIn))
	default:
		lw.reset = regular
	}
	lw.roll(now)
	return lw
}

// roll empties the window if its reset has come, moving the reset on by
// whole periods until it is in the future.
func (lw *liveWindow) roll(now time.Time) {
	if now.Before(lw.reset) {
		return
	}
	n := now.Sub(lw.reset)/lw.period + 1
	lw.reset = lw.reset.Add(n * lw.period)
	lw.used = 0
}

func (lw *liveWindow) full() bool { return lw.used >= lw.limit }

// fraction is used/limit, capped at 1.
func (lw *liveWindow) fraction() float64 {
	return min(1, float64(lw.used)/float64(lw.limit))
}

// percent is the usage endpoint's utilization: 0..100, one decimal,
// rounded down so that only a full window says 100.
func (lw *liveWindow) percent() float64 {
	return float64(min(lw.used, lw.limit)*1000/lw.limit) / 10
}

// header is the window as a unified header reports it. A rejecting window
// says rejected at 1.0; otherwise utilization is in whole percents,
// saturated at 0.99 like production.
func (lw *liveWindow) header(rejecting bool) window {
	w := window{key: lw.key, claim: lw.claim, reset: lw.reset}
	if rejecting {
		w.utilization, w.status = 1, "rejected"
		return w
	}
	pct := min(min(lw.used, lw.limit)*100/lw.limit, headerUtilizationCap)
	w.utilization, w.status = float64(pct)/100, allowedStatus(lw.fraction())
	return w
}

// all is every window of the account, in a fixed order.
func (lws *liveWindows) all() []*liveWindow {
	var out []*liveWindow
	for _, lw := range []*liveWindow{lws.fiveHour, lws.sevenDay} {
		if lw != nil {
			out = append(out, lw)
		}
	}
	for _, fam := range slices.Sorted(maps.Keys(lws.families)) {
		out = append(out, lws.families[fam])
	}
	return out
}

func (lws *liveWindows) roll(now time.Time) {
	for _, lw := range lws.all() {
		lw.roll(now)
	}
}

// applicable is the windows a request for model draws on: five_hour,
// seven_day and the window of the model's family.
func (lws *liveWindows) applicable(model string) []*liveWindow {
	var out []*liveWindow
	for _, lw := range []*liveWindow{lws.fiveHour, lws.sevenDay, lws.families[familyOf(model)]} {
		if lw != nil {
			out = append(out, lw)
		}
	}
	return out
}

// weeklyLimited reports whether the weekly window or a family window is
// full: the state a reset grant can clear.
func (lws *liveWindows) weeklyLimited() bool {
	if lws.sevenDay != nil && lws.sevenDay.full() {
		return true
	}
	for _, lw := range lws.families {
		if lw.full() {
			return true
		}
	}
	return false
}

// WindowState is one live window as GET /_sim/accounts/{name}/windows and
// Server.Windows report it.
type WindowState struct {
	Used  int64 `json:"used"`
	Limit int64 `json:"limit"`
	// Utilization is Used/Limit, capped at 1.
	Utilization float64   `json:"utilization"`
	ResetsAt    time.Time `json:"resets_at"`
	// Claim and Header are the window's claim and header infix.
	Claim  string `json:"claim"`
	Header string `json:"header"`
}

// WindowsState is an account's live windows; absent windows are null.
type WindowsState struct {
	FiveHour *WindowState           `json:"five_hour"`
	SevenDay *WindowState           `json:"seven_day"`
	Families map[string]WindowState `json:"families"`
	Overage  *Overage               `json:"overage"`
}

func (lw *liveWindow) state() *WindowState {
	if lw == nil {
		return nil
	}
	return &WindowState{Used: lw.used, Limit: lw.limit, Utilization: lw.fraction(), ResetsAt: lw.reset.UTC(), Claim: lw.claim, Header: lw.key}
}

func (lws *liveWindows) state() WindowsState {
	st := WindowsState{Families: map[string]WindowState{}}
	if lws == nil {
		return st
	}
	st.FiveHour, st.SevenDay = lws.fiveHour.state(), lws.sevenDay.state()
	for fam, lw := range lws.families {
		st.Families[fam] = *lw.state()
	}
	if lws.overage != nil {
		o := *lws.overage
		st.Overage = &o
	}
	return st
}

// script is the live windows written back as a script: current usage and
// absolute resets.
func (lws *liveWindows) script() *Windows {
	if lws == nil {
		return nil
	}
	win := func(lw *liveWindow) *Window {
		if lw == nil {
			return nil
		}
		return &Window{Limit: lw.limit, Used: lw.used, ResetsAt: lw.reset.UTC()}
	}
	ws := &Windows{FiveHour: win(lws.fiveHour), SevenDay: win(lws.sevenDay)}
	for fam, lw := range lws.families {
		if ws.Families == nil {
			ws.Families = map[string]FamilyWindow{}
		}
		ws.Families[fam] = FamilyWindow{Window: *win(lw), Claim: lw.claim, Header: lw.key}
	}
	if lws.overage != nil {
		o := *lws.overage
		ws.Overage = &o
	}
	return ws
}

// Windows returns the named account's live windows, rolled to the sim
// clock. An account without scripted windows has all of them null.
func (s *Server) Windows(name string) (WindowsState, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.reg.byName[name]
	if !ok {
		return WindowsState{}, fmt.Errorf("windows: %w: %q", errNoAccount, name)
	}
	if a.windows != nil {
		a.windows.roll(now)
	}
	return a.windows.state(), nil
}

// charge adds a successful request's tokens to every window it draws on.
func (s *Server) charge(a *account, model string, tokens int) {
	if a == nil {
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.windows == nil {
		return
	}
	a.windows.roll(now)
	for _, lw := range a.windows.applicable(model) {
		lw.used += int64(tokens)
	}
}

// unifiedView is what the unified headers of an answer to a request for
// model report: the windows (live or static), whether a live window
// rejects it, and the overage state.
type unifiedView struct {
	windows  []window
	rejected bool
	overage  *Overage
}

// unifiedView reads a's windows for a request for model. With admission,
// full windows reject (status rejected at 1.0); without, the request has
// been allowed and every window reports allowed or allowed_warning.
func (s *Server) unifiedView(a *account, model string, now time.Time, admission bool) unifiedView {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.windows == nil {
		return unifiedView{windows: []window{
			{key: "5h", claim: ClaimFiveHour, utilization: a.fiveHour, status: allowedStatus(a.fiveHour), reset: fiveHourReset(now)},
			{key: "7d", claim: ClaimSevenDay, utilization: a.sevenDay, status: allowedStatus(a.sevenDay), reset: sevenDayReset(now)},
		}}
	}
	a.windows.roll(now)
	var v unifiedView
	for _, lw := range a.windows.applicable(model) {
		rejecting := admission && lw.full()
		v.rejected = v.rejected || rejecting
		v.windows = append(v.windows, lw.header(rejecting))
	}
	if a.windows.overage != nil {
		o := *a.windows.overage
		v.overage = &o
	}
	return v
}
