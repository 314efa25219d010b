package controlplane

import (
	"encoding/json"
	"net/url"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// An account's run of transport failures: its transport cooldowns, one
// after another with no success between them (accounts.last_success_at
// before the cooldown was written), each counting on from the last. The
// run ends with a success, a cooldown of another reason (the upstream
// answered), a resume or a new base URL. Operators see it as the account
// being unreachable (Account.unreachable, `weir status`); routing reads it
// off the live cooldowns to say that a request's whole pool is
// (NoAccount.unreachable, route()).

// causeName is a transport cause's stored name ("dns"); "" for none, and
// "other" for a cause this build does not know (a newer worker's).
func causeName(c weirv1.TransportCause) string {
	switch {
	case c == weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED:
		return ""
	case c.Descriptor().Values().ByNumber(c.Number()) == nil:
		return enumName(weirv1.TransportCause_TRANSPORT_CAUSE_OTHER)
	}
	return enumName(c)
}

// continueRun is a transport cooldown's evidence continuing prior's run
// (the account's last transport cooldown, with no success since): the run
// keeps its start and counts this failure. Evidence from before runs
// counts as a run of one that started when it was written. Pure.
func continueRun(evidence []byte, prior db.Cooldown) []byte {
	var e, p storedEvidence
	if json.Unmarshal(evidence, &e) != nil {
		return evidence
	}
	since := prior.WrittenAt
	if json.Unmarshal(prior.Evidence, &p) == nil && p.Since != nil {
		since = *p.Since
	}
	e.Since, e.Attempts = &since, max(p.Attempts, 1)+1
	b, _ := json.Marshal(e)
	return b
}

// unreachableOf is the run a transport cooldown records, on an account of
// provider whose base URL override is baseURL. Pure.
func unreachableOf(c db.Cooldown, provider, baseURL string) *weirv1.Unreachable {
	var e storedEvidence
	_ = json.Unmarshal(c.Evidence, &e) // unreadable: a run of one, cause unknown
	u := &weirv1.Unreachable{
		Cause:    enumValue[weirv1.TransportCause](e.Cause),
		Error:    e.TransportError,
		Host:     upstreamHost(provider, baseURL),
		Since:    timestamppb.New(c.WrittenAt),
		LastAt:   timestamppb.New(c.WrittenAt),
		Attempts: max(e.Attempts, 1),
	}
	if e.Since != nil && e.Since.Before(c.WrittenAt) {
		u.Since = timestamppb.New(*e.Since)
	}
	if u.Cause == weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED {
		u.Cause = weirv1.TransportCause_TRANSPORT_CAUSE_OTHER
	}
	return u
}

// upstreamHost is the host an account's requests go to.
func upstreamHost(provider, baseURL string) string {
	u, err := url.Parse(accountBaseURL(provider, baseURL))
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// transportCooling says whether c is out of routing by a live transport
// cooldown and by nothing else (no spent window, no family gate).
func (c candidate) transportCooling(now time.Time) bool {
	return c.cooldown != nil && c.cooldown.Until.After(now) &&
		c.cooldown.Reason == enumName(weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT) &&
		c.spentUntil(now).IsZero() && (c.gate == nil || !c.gate.Until.After(now))
}
