package resty

type Client struct{}
type Request struct{}
type Response struct{}

func New() *Client                                         { return &Client{} }
func (c *Client) R() *Request                              { return &Request{} }
func (c *Client) SetHeader(h, v string) *Client            { return c }
func (r *Request) SetHeader(h, v string) *Request          { return r }
func (r *Request) SetHeaders(h map[string]string) *Request { return r }
func (r *Request) SetBody(b any) *Request                  { return r }
func (r *Request) Post(url string) (*Response, error)      { return nil, nil }
