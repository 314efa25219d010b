package policy

import (
	"encoding/json"
	"net/url"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// An account's run of transport failures: its transport cooldowns, one
// after another with no success between them, each counting on from the
// last (the control plane's unreachable.go says when a run ends). Routing
// reads it off the live cooldowns to say that a request's whole pool is
// unreachable (NoAccount.unreachable, Route).

// causeName is a transport cause's stored name ("dns"); "" for none, and
// "other" for a cause this build does not know (a newer worker's).
func causeName(c weirv1.TransportCause) string {
	switch {
	case c == weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED:
		return ""
	case c.Descriptor().Values().ByNumber(c.Number()) == nil:
		return vocab.Name(weirv1.TransportCause_TRANSPORT_CAUSE_OTHER)
	}
	return vocab.Name(c)
}

// ContinueRun is a transport cooldown's evidence continuing prior's run
// (the account's last transport cooldown, with no success since): the run
// keeps its start and counts this failure. Evidence from before runs
// counts as a run of one that started when it was written.
func ContinueRun(evidence []byte, prior Cooldown) []byte {
	var e, p Evidence
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

// Unreachable is the run a transport cooldown records, on an account whose
// requests go to baseURL.
func Unreachable(c Cooldown, baseURL string) *weirv1.Unreachable {
	var e Evidence
	_ = json.Unmarshal(c.Evidence, &e) // unreadable: a run of one, cause unknown
	u := &weirv1.Unreachable{
		Cause:    vocab.Value[weirv1.TransportCause](e.Cause),
		Error:    e.TransportError,
		Host:     host(baseURL),
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

// host is the host of a base URL; "" when it does not parse.
func host(baseURL string) string {
	u, err := url.Parse(baseURL)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// transportCooling says whether c is out of routing by a live transport
// cooldown and by nothing else (no spent window, no family gate).
func (c *Candidate) transportCooling(now time.Time) bool {
	return c.Cooldown != nil && c.Cooldown.Until.After(now) &&
		c.Cooldown.Reason == weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT &&
		c.spentUntil(now).IsZero() && (c.Gate == nil || !c.Gate.Until.After(now))
}
