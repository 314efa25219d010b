package dashboard

import (
	"net/http"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

type auditData struct {
	Events []*weirv1.AuditEvent
	// The filters as typed, and the next page's token ("" on the last).
	Actor, Procedure, Next string
}

// auditPage lists the audit log (AuditService), newest first, 50 a page.
func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	d := auditData{Actor: q.Get("actor"), Procedure: q.Get("procedure")}
	res, err := h.cfg.Audit.ListAuditEvents(r.Context(), connect.NewRequest(&weirv1.ListAuditEventsRequest{
		Actor: d.Actor, Procedure: d.Procedure, PageSize: 50, PageToken: q.Get("page"),
	}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d.Events, d.Next = res.Msg.Events, res.Msg.NextPageToken
	h.render(w, r, http.StatusOK, "audit", view{Title: "Audit", Nav: "audit", CSRF: s.csrf, Role: s.role, Data: d})
}
