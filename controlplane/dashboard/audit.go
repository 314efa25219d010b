package dashboard

import (
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

type auditData struct {
	Events []*weirv1.AuditEvent
	// The filters as typed, and the next page's token ("" on the last).
	// Target is one or more ids or names, comma-separated.
	Actor, Procedure, Target, Next string
}

// accountProcedures are the calls whose target is an account: their
// target links to the account's page.
const accountProcedures = "/weir.v1.AccountService/"

// accountTarget is the account id a call's target names ("ID (label)" or
// "ID"), "" when the call is not an account's or names no id.
func accountTarget(e *weirv1.AuditEvent) string {
	if !strings.HasPrefix(e.Procedure, accountProcedures) {
		return ""
	}
	id, _, _ := strings.Cut(e.Target, " (")
	if _, err := uuid.Parse(id); err != nil {
		return ""
	}
	return id
}

// auditPage lists the audit log (AuditService), newest first, 50 a page.
func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	d := auditData{Actor: q.Get("actor"), Procedure: q.Get("procedure"), Target: q.Get("target")}
	var targets []string
	for t := range strings.SplitSeq(d.Target, ",") {
		if t = strings.TrimSpace(t); t != "" {
			targets = append(targets, t)
		}
	}
	res, err := h.cfg.Audit.ListAuditEvents(r.Context(), connect.NewRequest(&weirv1.ListAuditEventsRequest{
		Actor: d.Actor, Procedure: d.Procedure, Targets: targets, PageSize: 50, PageToken: q.Get("page"),
	}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d.Events, d.Next = res.Msg.Events, res.Msg.NextPageToken
	h.render(w, r, http.StatusOK, "audit", view{Title: "Audit", Nav: "audit", CSRF: s.csrf, Role: s.role, Data: d})
}
