"""Model implementations that satisfy `tfgen.models.protocol.CausalLMProtocol`."""
