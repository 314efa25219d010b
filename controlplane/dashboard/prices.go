package dashboard

import (
	"net/http"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// priceView is one row of the price table.
type priceView struct {
	Pattern                              string
	Input, Output, CacheRead, CacheWrite float64
	Shipped                              bool
	Updated                              *time.Time
}

type pricesData struct {
	// Operator's are the operator's prices, Shipped weir's (those the
	// operator's do not replace); AsOf is the shipped table's date.
	Operator, Shipped []priceView
	AsOf              string
}

// Tabs is the usage pages' navigation from this page.
func (pricesData) Tabs() tabs { return tabs{Tab: "prices"} }

// pricesPage lists the price table, read-only: prices are set with `weir
// prices set`.
func (h *Handler) pricesPage(w http.ResponseWriter, r *http.Request, s session) {
	res, err := h.cfg.Usage.ListPrices(r.Context(), connect.NewRequest(&weirv1.ListPricesRequest{}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := pricesData{AsOf: res.Msg.AsOf}
	for _, p := range res.Msg.Prices {
		v := priceView{Pattern: p.Pattern, Input: p.InputUsd, Output: p.OutputUsd, CacheRead: p.CacheReadUsd,
			CacheWrite: p.CacheWriteUsd, Shipped: p.Shipped, Updated: tsPtr(p.UpdatedAt)}
		if p.Shipped {
			d.Shipped = append(d.Shipped, v)
		} else {
			d.Operator = append(d.Operator, v)
		}
	}
	h.render(w, r, http.StatusOK, "prices", view{Title: "Prices", Nav: "usage", CSRF: s.csrf, Role: s.role, Data: d})
}
