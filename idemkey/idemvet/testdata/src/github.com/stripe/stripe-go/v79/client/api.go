package client

import (
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

type API struct{ Charges *charge.Client }

func New(key string, backends *stripe.Params) *API { return &API{Charges: &charge.Client{Key: key}} }
