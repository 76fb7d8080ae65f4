"""Model implementations that satisfy `tfgen.decoding.model_protocol.CausalLMProtocol`."""
