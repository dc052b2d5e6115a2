"""agentrl.inference"""
