package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// errNoAccount is returned when a control call names an account that the
// script does not have.
var errNoAccount = errors.New("no such account")

// maxDiscovered bounds how many unlisted credentials are remembered as
// accounts under AcceptUnknown; later ones are still served, but get no
// fault queue of their own.
const maxDiscovered = 1000

// account is the live state of one scripted (or discovered) account. All
// fields but faults are fixed once the account is registered; faults is
// guarded by Server.mu.
type account struct {
	name       string
	credential string // never logged
	kind       string
	revoked    bool
	fiveHour   float64
	sevenDay   float64
	faults     []Fault
}

// registry is the current script in lookup form. Guarded by Server.mu.
type registry struct {
	acceptUnknown bool
	order         []*account // script order, then discovered accounts
	byCred        map[string]*account
	byName        map[string]*account
	discovered    int
}

func newRegistry(sc Script) *registry {
	reg := &registry{
		acceptUnknown: sc.AcceptUnknown,
		byCred:        map[string]*account{},
		byName:        map[string]*account{},
	}
	for _, as := range sc.Accounts {
		a := &account{
			name:       as.Name,
			credential: as.Credential,
			kind:       as.Kind,
			revoked:    as.Revoked,
			fiveHour:   as.FiveHourUtilization,
			sevenDay:   as.SevenDayUtilization,
		}
		if a.kind == "" {
			a.kind = KindAPIKey
			if strings.HasPrefix(as.Credential, "sk-ant-oat") {
				a.kind = KindOAuth
			}
		}
		for _, f := range as.Faults {
			a.faults = append(a.faults, f.normalized())
		}
		reg.add(a)
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
	a := &account{name: "key-" + hex.EncodeToString(sum[:4]), credential: cred, kind: kind}
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
	reg := newRegistry(sc)
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
// applies to model.
func (s *Server) takeFault(a *account, model string) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range a.faults {
		if f.Model != "" && f.Model != model {
			continue
		}
		if f.Times > 0 {
			a.faults[i].Times--
			if a.faults[i].Times == 0 {
				a.faults = slices.Delete(a.faults, i, i+1)
			}
		}
		return f.normalized(), true
	}
	return Fault{}, false
}

// script returns the current script with the remaining fault queues and
// masked credentials.
func (s *Server) script() Script {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := Script{AcceptUnknown: s.reg.acceptUnknown, Accounts: []AccountScript{}}
	for _, a := range s.reg.order {
		as := AccountScript{
			Name:                a.name,
			Credential:          maskCredential(a.credential),
			Kind:                a.kind,
			Revoked:             a.revoked,
			FiveHourUtilization: a.fiveHour,
			SevenDayUtilization: a.sevenDay,
			Faults:              []Fault{},
		}
		for _, f := range a.faults {
			as.Faults = append(as.Faults, f.normalized())
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

// Reset clears every account's fault queue and the attempt log.
func (s *Server) Reset() {
	s.mu.Lock()
	for _, a := range s.reg.order {
		a.faults = nil
	}
	s.mu.Unlock()
	s.attempts.clear()
	s.log.Info("sim reset")
}
