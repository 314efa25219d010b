package translate

import "errors"

var errTODO = errors.New("not yet")

func ResponsesToMessagesRequest(body []byte, model, cacheKey string) (Request, error) { return Request{}, errTODO }
func MessagesToResponsesAnswer(body []byte, model string, req Request) ([]byte, error) { return nil, errTODO }
func NewMessagesToResponsesStream(model string, req Request) Stream                   { return nil }
func ChatToMessagesRequest(body []byte, model, cacheKey string) (Request, error)      { return Request{}, errTODO }
func MessagesToChatAnswer(body []byte, model string, req Request) ([]byte, error)     { return nil, errTODO }
func NewMessagesToChatStream(model string, req Request) Stream                        { return nil }
