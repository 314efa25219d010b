package policy

import (
	"testing"
	"time"
)

func TestDecideBankedReset(t *testing.T) {
	t.Parallel()
	now := epoch
	in := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	avail := func(id string, exp *time.Time) Grant {
		return Grant{ID: id, Program: "max-resets", Status: GrantAvailable, ExpiresAt: exp}
	}
	for _, tc := range []struct {
		name  string
		in    BankedInput
		claim string // "": no claim
	}{
		{"no grants", BankedInput{WeeklyLimited: true}, ""},
		{"at the limit: the soonest-expiring grant", BankedInput{WeeklyLimited: true,
			Grants: []Grant{avail("never", nil), avail("late", in(100*time.Hour)), avail("soon", in(50*time.Hour))}}, "soon"},
		{"used and expired grants are skipped", BankedInput{WeeklyLimited: true,
			Grants: []Grant{{ID: "u", Status: GrantUsed}, avail("x", in(-time.Minute)), avail("ok", nil)}}, "ok"},
		{"not at the limit", BankedInput{SevenDay: f64(0.98), Grants: []Grant{avail("g", in(100*time.Hour))}}, ""},
		{"within the hour of the last claim", BankedInput{WeeklyLimited: true, LastClaim: in(-59 * time.Minute),
			Grants: []Grant{avail("g", nil)}}, ""},
		{"an hour after the last claim", BankedInput{WeeklyLimited: true, LastClaim: in(-time.Hour),
			Grants: []Grant{avail("g", nil)}}, "g"},
		{"expiring, half the week used", BankedInput{SevenDay: f64(0.5), Grants: []Grant{avail("g", in(2*time.Hour))}}, "g"},
		{"expiring, week mostly unused", BankedInput{SevenDay: f64(0.49), Grants: []Grant{avail("g", in(time.Hour))}}, ""},
		{"expiring, no evidence of the week", BankedInput{Grants: []Grant{avail("g", in(time.Hour))}}, ""},
		{"not expiring soon enough", BankedInput{SevenDay: f64(0.9), Grants: []Grant{avail("g", in(2*time.Hour+time.Second))}}, ""},
		{"manual overrides the weekly limit", BankedInput{ManualGrant: "b", SevenDay: f64(0.1),
			Grants: []Grant{avail("a", in(time.Hour)), avail("b", nil)}}, "b"},
		{"manual keeps the hourly rule", BankedInput{ManualGrant: "b", LastClaim: in(-time.Minute),
			Grants: []Grant{avail("b", nil)}}, ""},
		{"manual of an unavailable grant", BankedInput{ManualGrant: "b", Grants: []Grant{{ID: "b", Status: GrantUsed}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			d := DecideBankedReset(tc.in)
			got := ""
			if d.Claim {
				got = d.Grant.ID
			}
			if got != tc.claim || d.Why == "" {
				t.Errorf("claim %q (%s), want %q", got, d.Why, tc.claim)
			}
		})
	}
}
