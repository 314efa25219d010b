package controlplane

import (
	"time"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The stored rows as policy reads them: one conversion per type, and the
// only place that knows both shapes.

// policyAccount is an account as routing reads it.
func policyAccount(a db.Account) policy.Account {
	return policy.Account{
		ID:             a.ID,
		Label:          a.Label,
		Provider:       enumValue[weirv1.Provider](a.Provider),
		AuthKind:       enumValue[weirv1.AuthKind](a.AuthKind),
		BaseURL:        accountBaseURL(a.Provider, a.BaseUrl),
		Paused:         a.Paused,
		Broken:         a.BrokenAt != nil,
		RecoveryProbe:  a.RecoveryProbe,
		MaxConcurrency: a.MaxConcurrency,
		Priority:       a.Priority,
		LastUsedAt:     a.LastUsedAt,
		OverloadedAt:   a.OverloadedAt,
		OwnerKey:       a.OwnerKeyID.UUID,
		OwnerTeam:      a.OwnerTeamID.UUID,
	}
}

// policyCooldown is a cooldown with its quota evidence, if any.
func policyCooldown(c db.Cooldown) policy.Cooldown {
	out := policy.Cooldown{
		Reason:    enumValue[weirv1.CooldownReason](c.Reason),
		Transient: c.Transient,
		Until:     c.Until,
		WrittenAt: c.WrittenAt,
		Evidence:  c.Evidence,
	}
	if c.QuotaKind != nil {
		out.Quota = &policy.QuotaRecord{Kind: enumValue[weirv1.QuotaKind](*c.QuotaKind),
			WindowMinutes: c.QuotaWindowMinutes, Message: c.QuotaMessage}
		if c.QuotaResetsAt != nil {
			out.Quota.ResetsAt = *c.QuotaResetsAt
		}
	}
	return out
}

// policyGate is a family gate.
func policyGate(g db.FamilyGate) policy.Gate {
	return policy.Gate{Family: g.Family, Until: g.Until, WrittenAt: g.WrittenAt, Evidence: g.Evidence}
}

// policyWindow is an account-wide window of the routing view; nil (no
// evidence) without both a utilization and a reset.
func policyWindow(utilization *float64, resetsAt *time.Time) *policy.Window {
	if utilization == nil || resetsAt == nil {
		return nil
	}
	return &policy.Window{Utilization: *utilization, ResetsAt: *resetsAt}
}

// policySample is one usage snapshot.
func policySample(r db.RecentUsageSnapshotsRow) policy.Sample {
	return policy.Sample{At: r.TakenAt, Utilization: r.Utilization, ResetsAt: r.ResetsAt}
}

// policyBreaker is an overload breaker's state.
func policyBreaker(b db.OverloadBreaker) policy.Breaker {
	return policy.Breaker{
		Overloads: b.Overloads, WindowStart: b.WindowStart, OpenUntil: b.OpenUntil, OpenCount: b.OpenCount,
		ProbeUntil: b.ProbeUntil, SeenAccounts: b.SeenAccounts, JudgedAccounts: b.JudgedAccounts, ProbedAccounts: b.ProbedAccounts,
		ProbeEvery: time.Duration(b.ProbeEveryMs) * time.Millisecond,
	}
}

// policyReadings are a usage read's windows.
func policyReadings(rs []usageReading) []policy.Reading {
	out := make([]policy.Reading, len(rs))
	for i, r := range rs {
		out[i] = policy.Reading{Window: r.window, Utilization: r.utilization, ResetsAt: r.resetsAt}
	}
	return out
}

// policyGrants are an account's stored reset grants.
func policyGrants(gs []db.ResetGrant) []policy.Grant {
	out := make([]policy.Grant, 0, len(gs))
	for _, g := range gs {
		out = append(out, policy.Grant{ID: g.GrantID, Program: g.Program, Status: g.Status, ExpiresAt: g.ExpiresAt})
	}
	return out
}
