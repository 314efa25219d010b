package sim

import "net/http"

type model struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

type modelList struct {
	Data    []model `json:"data"`
	HasMore bool    `json:"has_more"`
	FirstID string  `json:"first_id"`
	LastID  string  `json:"last_id"`
}

// models is what GET /v1/models lists, newest first like the real API.
var models = []model{
	{Type: "model", ID: "claude-haiku-4-5-20251001", DisplayName: "Claude Haiku 4.5", CreatedAt: "2025-10-01T00:00:00Z"},
	{Type: "model", ID: "claude-sonnet-4-5-20250929", DisplayName: "Claude Sonnet 4.5", CreatedAt: "2025-09-29T00:00:00Z"},
	{Type: "model", ID: "claude-opus-4-1-20250805", DisplayName: "Claude Opus 4.1", CreatedAt: "2025-08-05T00:00:00Z"},
	{Type: "model", ID: "claude-opus-4-20250514", DisplayName: "Claude Opus 4", CreatedAt: "2025-05-22T00:00:00Z"},
	{Type: "model", ID: "claude-sonnet-4-20250514", DisplayName: "Claude Sonnet 4", CreatedAt: "2025-05-22T00:00:00Z"},
}

// handleModels serves GET /v1/models: Anthropic's list, or OpenAI's for
// an API key sent as a bearer without the OAuth beta (the one path both
// providers list their models at).
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	if _, bearer := bearerToken(r.Header.Get("Authorization")); bearer && r.Header.Get("x-api-key") == "" && !hasBeta(r.Header, oauthBeta) {
		s.handleOpenAIModels(w, r)
		return
	}
	x, ok := s.admit(w, r)
	if !ok {
		return
	}
	x.record(outcomeOK, http.StatusOK)
	writeJSON(w, http.StatusOK, modelList{
		Data:    models,
		FirstID: models[0].ID,
		LastID:  models[len(models)-1].ID,
	})
}

// openAIModel is one entry of OpenAI's GET /v1/models.
type openAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type openAIModelList struct {
	Object string        `json:"object"`
	Data   []openAIModel `json:"data"`
}

// handleOpenAIModels serves OpenAI's models list to an OpenAI API key.
func (s *Server) handleOpenAIModels(w http.ResponseWriter, r *http.Request) {
	x := &exchange{s: s, w: w, r: r, wire: surfaceChat.toolWire()}
	acct, outcome, code, message := s.authenticateOpenAI(r.Header, surfaceChat)
	x.acct = acct
	if outcome != "" {
		x.failOpenAI(outcome, http.StatusUnauthorized, "invalid_request_error", code, message)
		return
	}
	x.record(outcomeOK, http.StatusOK)
	writeJSON(w, http.StatusOK, openAIModelList{Object: "list", Data: []openAIModel{
		{ID: "gpt-5", Object: "model", Created: 1754425777, OwnedBy: "system"},
		{ID: "gpt-5-mini", Object: "model", Created: 1754425928, OwnedBy: "system"},
	}})
}
