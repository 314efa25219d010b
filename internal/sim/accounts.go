package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"
)

// errNoAccount is returned when a control call names an account that the
// script does not have.
var errNoAccount = errors.New("no such account")

// maxDiscovered bounds how many unlisted credentials are remembered as
// accounts under AcceptUnknown; later ones are still served, but get no
// fault queue of their own.
const maxDiscovered = 1000

// account is the live state of one scripted (or discovered) account.
// name, kind, revoked, fiveHour, sevenDay and the tool fields are fixed
// once the account is registered; every other field is guarded by
// Server.mu.
type account struct {
	name       string
	credential string // the current access token or key; never logged
	kind       string
	revoked    bool
	fiveHour   float64
	sevenDay   float64
	faults     []Fault

	tools toolSettings // as resolved against the script's and the defaults
	// scriptedToolCalls and scriptedPreferTools are the account's own
	// tool_calls_per_turn and prefer_tools, as the script shows them.
	scriptedToolCalls   *int
	scriptedPreferTools []string

	windows *liveWindows // nil: the static utilizations above
	// expires is when credentials of the account stop working: one with
	// access_expires_in, those issued by a refresh, and those a refresh
	// replaced (after their grace).
	expires         map[string]time.Time
	refreshToken    string // the current one; "" when not refreshable
	accessLifetime  time.Duration
	accessExpiresIn Duration // as scripted
	refreshCalls    int
	usageReadLimit  int // -1: no limit
	usageReads      []time.Time
	grants          []*grantState
	grantResults    map[string]string // claim results by request_id
	// chatgptID is a chatgpt account's account id; "" for other kinds and
	// for discovered chatgpt accounts, which accept any.
	chatgptID string
	// promptCache is when each prompt prefix the account cached was last
	// used (usage.go).
	promptCache map[prefixKey]time.Time
}

// registry is the current script in lookup form. Guarded by Server.mu.
type registry struct {
	acceptUnknown bool
	order         []*account          // script order, then discovered accounts
	byCred        map[string]*account // current and superseded credentials
	byName        map[string]*account
	byRefresh     map[string]*account // valid refresh tokens
	usedRefresh   map[string]*account // refresh tokens a refresh used up
	discovered    int
	codes         map[string]*authCode // unspent authorization codes (login.go)

	// tools are the script-level tool settings, which discovered accounts
	// get; toolCalls and preferTools are them as scripted.
	tools       toolSettings
	toolCalls   *int
	preferTools []string
}

// newRegistry builds the registry of sc with the wall clock; the server
// uses newRegistryAt with its own clock.
func newRegistry(sc Script) *registry { return newRegistryAt(sc, time.Now()) }

// newRegistryAt builds the registry of sc, resolving its relative times
// (reset_in, expires_in, access_expires_in) against now.
func newRegistryAt(sc Script, now time.Time) *registry {
	reg := &registry{
		acceptUnknown: sc.AcceptUnknown,
		tools:         defaultToolSettings.override(sc.ToolCallsPerTurn, sc.PreferTools),
		toolCalls:     clonePtr(sc.ToolCallsPerTurn),
		preferTools:   slices.Clone(sc.PreferTools),
		byCred:        map[string]*account{},
		byName:        map[string]*account{},
		byRefresh:     map[string]*account{},
		usedRefresh:   map[string]*account{},
	}
	for _, as := range sc.Accounts {
		a := &account{
			name:            as.Name,
			credential:      as.Credential,
			kind:            as.kind(),
			revoked:         as.Revoked,
			fiveHour:        as.FiveHourUtilization,
			sevenDay:        as.SevenDayUtilization,
			tools:           reg.tools.override(as.ToolCallsPerTurn, as.PreferTools),
			windows:         newLiveWindows(as.Windows, now),
			expires:         map[string]time.Time{},
			refreshToken:    as.RefreshToken,
			accessLifetime:  defaultAccessLifetime,
			accessExpiresIn: as.AccessExpiresIn,
			usageReadLimit:  as.UsageReadsPer10m,
			grantResults:    map[string]string{},
		}
		a.scriptedToolCalls, a.scriptedPreferTools = clonePtr(as.ToolCallsPerTurn), slices.Clone(as.PreferTools)
		if a.kind == KindChatGPT {
			a.chatgptID = as.chatGPTAccountID()
			a.accessLifetime = defaultChatGPTAccessLifetime
		}
		if as.AccessExpiresIn > 0 {
			a.accessLifetime = time.Duration(as.AccessExpiresIn)
			a.expires[a.credential] = now.Add(a.accessLifetime)
		}
		if a.usageReadLimit == 0 {
			a.usageReadLimit = defaultUsageReadsPer10m
		}
		for _, g := range as.Grants {
			gs := &grantState{id: g.ID, program: g.Program, expiresAt: g.ExpiresAt}
			if g.ExpiresIn > 0 {
				gs.expiresAt = now.Add(time.Duration(g.ExpiresIn))
			}
			a.grants = append(a.grants, gs)
		}
		for _, f := range as.Faults {
			a.faults = append(a.faults, f.normalized())
		}
		reg.add(a)
		if a.refreshToken != "" {
			reg.byRefresh[a.refreshToken] = a
		}
	}
	return reg
}

func (reg *registry) add(a *account) {
	reg.order = append(reg.order, a)
	reg.byCred[a.credential] = a
	reg.byName[a.name] = a
}

// discover returns the account for an unlisted credential under
// AcceptUnknown, registering it so that faults can be queued for it.
func (reg *registry) discover(cred, kind string) *account {
	sum := sha256.Sum256([]byte(cred))
	a := &account{
		name: "key-" + hex.EncodeToString(sum[:4]), credential: cred, kind: kind,
		expires: map[string]time.Time{}, usageReadLimit: defaultUsageReadsPer10m, grantResults: map[string]string{},
		tools: reg.tools,
	}
	_, taken := reg.byName[a.name]
	if !taken && reg.discovered < maxDiscovered {
		reg.discovered++
		reg.add(a)
	}
	return a
}

// SetScript replaces the script: accounts, their fault queues and
// AcceptUnknown. Accounts discovered under AcceptUnknown are forgotten. The
// attempt log is kept.
func (s *Server) SetScript(sc Script) error {
	if err := sc.Validate(); err != nil {
		return fmt.Errorf("set script: %w", err)
	}
	reg := newRegistryAt(sc, s.now())
	s.mu.Lock()
	s.reg = reg
	s.mu.Unlock()
	s.log.Info("sim script replaced", "accounts", len(sc.Accounts), "accept_unknown", sc.AcceptUnknown)
	return nil
}

// AddFaults appends faults to the queue of the named account.
func (s *Server) AddFaults(name string, faults ...Fault) error {
	if err := validateFaults("faults", faults); err != nil {
		return fmt.Errorf("add faults: %w", err)
	}
	s.mu.Lock()
	a, ok := s.reg.byName[name]
	if ok {
		for _, f := range faults {
			a.faults = append(a.faults, f.normalized())
		}
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("add faults: %w: %q", errNoAccount, name)
	}
	s.log.Info("sim faults added", "account", name, "faults", len(faults))
	return nil
}

// takeFault consumes one attempt of the first queued fault of a that
// applies to model. A timed fault that has run out is consumed on the way,
// whatever its model, and a For fault begins its time at its first
// attempt.
func (s *Server) takeFault(a *account, model string) (Fault, bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < len(a.faults); i++ {
		f := &a.faults[i]
		if f.expired(now) {
			a.faults = slices.Delete(a.faults, i, i+1)
			i--
			continue
		}
		if f.Model != "" && f.Model != model {
			continue
		}
		if f.For > 0 && f.ends.IsZero() {
			f.ends = now.Add(time.Duration(f.For))
		}
		taken := f.normalized()
		if f.Times > 0 {
			f.Times--
			if f.Times == 0 {
				a.faults = slices.Delete(a.faults, i, i+1)
			}
		}
		return taken, true
	}
	return Fault{}, false
}

// script returns the current script with the remaining fault queues and
// masked credentials.
func (s *Server) script() Script {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := Script{
		AcceptUnknown: s.reg.acceptUnknown, Accounts: []AccountScript{},
		ToolCallsPerTurn: clonePtr(s.reg.toolCalls), PreferTools: slices.Clone(s.reg.preferTools),
	}
	for _, a := range s.reg.order {
		as := AccountScript{
			Name:                a.name,
			Credential:          maskCredential(a.credential),
			Kind:                a.kind,
			Revoked:             a.revoked,
			FiveHourUtilization: a.fiveHour,
			SevenDayUtilization: a.sevenDay,
			Faults:              []Fault{},
			ToolCallsPerTurn:    clonePtr(a.scriptedToolCalls),
			PreferTools:         slices.Clone(a.scriptedPreferTools),
		}
		for _, f := range a.faults {
			if f.expired(now) {
				continue
			}
			as.Faults = append(as.Faults, f.scripted())
		}
		if a.windows != nil {
			a.windows.roll(now)
			as.Windows = a.windows.script()
		}
		if a.refreshToken != "" {
			as.RefreshToken = maskCredential(a.refreshToken)
		}
		as.AccessExpiresIn = a.accessExpiresIn
		if a.kind == KindChatGPT && a.chatgptID != "" {
			as.ChatGPTAccountID = a.chatgptID
		}
		if a.usageReadLimit != defaultUsageReadsPer10m {
			as.UsageReadsPer10m = a.usageReadLimit
		}
		for _, g := range a.grants {
			as.Grants = append(as.Grants, Grant{ID: g.id, Program: g.program, ExpiresAt: g.expiresAt.UTC()})
		}
		sc.Accounts = append(sc.Accounts, as)
	}
	return sc
}

// maskCredential keeps only the last 4 characters, and none of a short
// credential.
func maskCredential(c string) string {
	if len(c) < 8 {
		return "…"
	}
	return "…" + c[len(c)-4:]
}

// Reset clears every account's fault queue and the attempt log, with the
// logs kept beside it: refresh counts and the usage endpoint's read
// history. Windows, tokens and grants are account state and stay.
func (s *Server) Reset() {
	s.mu.Lock()
	for _, a := range s.reg.order {
		a.faults = nil
		a.refreshCalls = 0
		a.usageReads = nil
	}
	s.mu.Unlock()
	s.attempts.clear()
	s.log.Info("sim reset")
}
