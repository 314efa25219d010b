// Package failpolicy is the one table of what an attempt's outcome calls
// for before anything else is known: the control plane's decide starts
// from it and refines it with the evidence and the state only it has (the
// 429 ladder, a same-account overload retry, quota), and a data-plane
// worker that cannot reach the control plane to release a lease acts on
// it alone. Both planes import it, so they never disagree on a class.
package failpolicy

import weirv1 "github.com/weirhq/weir/gen/weir/v1"

// Default is the action an outcome of class c calls for on its own, when
// nothing reached the client. An answer the request is at fault for, a
// success, a stream already cut after output and a client that left are
// answered as they are; anything an account or a path on the way may be
// at fault for is tried on another account.
func Default(c weirv1.OutcomeClass) weirv1.Action {
	switch c {
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR,
		weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED,
		weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED,
		weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR,
		weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR:
		return weirv1.Action_ACTION_FAILOVER
	}
	return weirv1.Action_ACTION_RESPOND
}

// For is Default for an outcome, and RESPOND once bytes reached the
// client: from then on nothing can be replayed.
func For(o *weirv1.Outcome) weirv1.Action {
	if o.GetBytesToClient() {
		return weirv1.Action_ACTION_RESPOND
	}
	return Default(o.GetClass())
}
