// placeholder until capi lands
